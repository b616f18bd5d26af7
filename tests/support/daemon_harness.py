"""Run the real daemon (`python -m monitor.cli run`) as a subprocess in tests and the demo."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from monitor.service import send_when_free

REPO_ROOT = Path(__file__).resolve().parents[2]
# A policy watching the fake Hub's `fake-org` step branches, alerting into a JSON-lines file.
WATCHER_POLICY = """\
name: watcher
watch:
  - name: tiny
    author: fake-org
    revisions: {branches: "step\\\\d+"}
route: {receiver: log, group_wait: 0s, group_interval: 0s}
receivers:
  - name: log
    file: {path: alerts.jsonl}
"""

# WATCHER_POLICY with a budget of one parameter: the gate refuses every checkpoint it discovers
# (skipped, "over budget"), so nothing is fetched or scored. For daemons whose tests look at
# polls, the API or faults, never at a score: a score starts a scoring worker, which imports
# torch and transformers for nothing.
_REVISIONS_LINE = '    revisions: {branches: "step\\\\d+"}\n'
UNSCORED_WATCHER_POLICY = WATCHER_POLICY.replace(_REVISIONS_LINE, _REVISIONS_LINE + "    budgets: {max_params: 1}\n")
assert UNSCORED_WATCHER_POLICY != WATCHER_POLICY

FAST_FLAGS = ("--poll-every", "1s", "--score-every", "1s", "--outbox-every", "1s", "--reload-every", "1s",
              "--watchdog-every", "1s", "--report-every", "2s", "--drain", "20s")


def wait_for(predicate: Callable[[], Any], *, timeout: float, what: str, every: float = 0.2) -> Any:
    """Poll `predicate` until it returns something truthy; raise AssertionError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


class DaemonProcess:
    """One `lstar run` subprocess on `state_dir`, with its output in STATE/daemon-<n>.log."""

    count = 0

    def __init__(self, policies_dir: Path, state_dir: Path, *, endpoint: str | None = None,
                 args: Sequence[str] = (), env: dict[str, str] | None = None, fast: bool = True,
                 start_timeout: float = 60) -> None:
        self.policies_dir, self.state_dir = Path(policies_dir), Path(state_dir)
        self.start_timeout = start_timeout   # `with` waits this long for the API (an explicit
                                             # --score-memory imports torch once before it starts)
        self.endpoint = endpoint
        self.args = [*(FAST_FLAGS if fast else ()), *args]
        self.env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
        if env is None or "LSTAR_FAILPOINT" not in env:
            self.env.pop("LSTAR_FAILPOINT", None)
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.url: str | None = None

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "monitor.cli", "run", "--policies", str(self.policies_dir),
               "--state", str(self.state_dir), "--api-port", "0", *self.args]
        if self.endpoint:
            cmd += ["--endpoint", self.endpoint]
        return cmd

    def start(self, *, wait: bool = True, timeout: float = 60) -> "DaemonProcess":
        self.state_dir.mkdir(parents=True, exist_ok=True)
        DaemonProcess.count += 1
        self.log_path = self.state_dir / f"daemon-{DaemonProcess.count}.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                     cwd=REPO_ROOT)
        log.close()
        if wait:
            self.url = wait_for(self._api_url, timeout=timeout, what=f"the daemon's API\n{self.log()}")
        return self

    def _api_url(self) -> str | None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the daemon exited with {self.proc.returncode}:\n{self.log()}")
        try:
            info = json.loads((self.state_dir / "daemon.json").read_text())
        except (OSError, ValueError):
            return None
        return info["url"] if info.get("pid") == self.proc.pid else None

    def request(self, path: str, *, method: str = "GET", headers: dict[str, str] | None = None,
                body: bytes | None = None) -> tuple[int, bytes]:
        """(status, body) of one API request."""
        assert self.url is not None
        # Surrounding whitespace is not part of a header's value (RFC 9110 5.5); httpx refuses it.
        sent = {k: v.strip() for k, v in (headers or {}).items()}
        response = send_when_free(httpx.Request(method, self.url + path, headers=sent, content=body),
                                  timeout=30)
        return response.status_code, response.content

    def api_token(self) -> str:
        """The token the daemon wrote to STATE/api.token (state-changing requests need it)."""
        return (self.state_dir / "api.token").read_text().strip()

    def post_json(self, path: str, body: Any, *, token: str | None = None,
                  headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """(status, body) of a JSON POST with the daemon's token (or `token`)."""
        sent = {"Content-Type": "application/json",
                "Authorization": f"Bearer {self.api_token() if token is None else token}", **(headers or {})}
        return self.request(path, method="POST", headers=sent, body=json.dumps(body).encode())

    def get_json(self, path: str) -> Any:
        status, body = self.request(path)
        assert status in (200, 503), (status, body)
        return json.loads(body)

    def status(self) -> dict[str, Any]:
        return self.get_json("/status")

    def wait(self, timeout: float = 60) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Send `sig` and wait for the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL (a crash); the exit is awaited."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def __enter__(self) -> "DaemonProcess":
        return self.start(timeout=self.start_timeout)

    def __exit__(self, *exc: object) -> None:
        self.kill()
