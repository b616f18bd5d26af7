"""`lstar receiver`: a local webhook receiver for trying a policy's webhook (`monitor.alerts.receiver`)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import typer

from monitor.commands.options import OptionError, int_option
from monitor.commands.terminal import echo
from monitor.errors import DeliveryError, ServiceError

MAX_SECRET_FILE_BYTES = 4096


def read_receiver_secret(secret_env: str | None, secret_file: Path | None) -> str:
    """The `whsec_` secret from the environment variable or the file (exactly one), never echoed."""
    if (secret_env is None) == (secret_file is None):
        raise OptionError("give exactly one of --secret-env NAME or --secret-file FILE "
                          "(the secret the policy's webhook receiver signs with)")
    if secret_file is not None:
        try:
            with open(secret_file, "rb") as handle:
                raw = handle.read(MAX_SECRET_FILE_BYTES + 1)
        except OSError as exc:
            raise DeliveryError(f"cannot read the secret file {secret_file}: {exc.strerror}",
                                hint="give the file the webhook receiver's secret_file names") from None
        if len(raw) > MAX_SECRET_FILE_BYTES:
            raise DeliveryError(f"the secret file {secret_file} is over {MAX_SECRET_FILE_BYTES} bytes",
                                hint="it holds one `whsec_...` line")
        return raw.decode("utf-8", errors="replace").strip()
    assert secret_env is not None
    value = os.environ.get(secret_env, "").strip()
    if not value:
        raise DeliveryError(f"{secret_env} is not set",
                            hint=f"export {secret_env} with the secret the policy's webhook receiver signs with, "
                                 "or give --secret-file")
    return value


def register(app: typer.Typer) -> None:
    @app.command("receiver")
    def receiver(
        port: int = int_option(8099, "--port", low=1, high=65535, help="Port on 127.0.0.1 to listen on."),
        secret_env: str | None = typer.Option(None, "--secret-env", help="Environment variable holding the "
                                              "`whsec_` secret (as the receiver's secret_env names it)."),
        secret_file: Path | None = typer.Option(None, "--secret-file", help="File holding the secret instead "
                                                "(as its secret_file names it)."),
    ) -> None:
        """Receive webhooks on 127.0.0.1 and print each one, checking its Standard Webhooks signature.

        For trying a policy's webhook receiver by hand: point its url at http://127.0.0.1:PORT/ANY-PATH,
        run `lstar alerts test RECEIVER --policy FILE` in another shell, and each message is printed
        here with "signature ok" (answered 204) or why the signature was refused (answered 401).
        Ctrl-C stops it. Nothing is stored.
        """
        import uvicorn

        from monitor.alerts.receiver import receiver_app

        secret = read_receiver_secret(secret_env, secret_file)
        app_ = receiver_app(secret, lambda text: print(text, flush=True))
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            sock.close()
            raise ServiceError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}",
                               hint="choose another --port") from None
        echo(f"listening on http://127.0.0.1:{port}/ (Ctrl-C stops)", err=True)
        server = uvicorn.Server(uvicorn.Config(app_, log_level="warning", access_log=False))
        try:
            server.run(sockets=[sock])
        finally:
            sock.close()
