"""The secrets a policy's receivers name: read at delivery, and resolved ahead of it.

A receiver names where its secret lives (`secret_env`/`secret_file` of a webhook,
`username_env` and `password_env`/`password_file` of an email receiver), never the secret
itself. The same code reads them for a delivery and checks them before one (`lstar policy
check`, the daemon's start and reload), so a secret that is missing is found when the
policy is checked or loaded, not when the first alert goes dead.

A variable must be set and non-empty. A file is resolved against the policy file's folder
and read with the bounded reads of `monitor.files` (a regular file of at most
`SECRET_MAX_BYTES`; a FIFO or a device is an error, never a hang); it must be UTF-8 and
non-empty once stripped. Errors name the variable, the file, the receiver and the key;
never the value.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from monitor.errors import DeliveryError, PolicyError
from monitor.files import FileKind, read_bounded_bytes

SECRET_FILE = FileKind("secret file", "secret files", "text")
SECRET_MAX_BYTES = 64 << 10
# Per channel: the keys that name a secret's source.
SECRET_KEYS = {"webhook": ("secret_env", "secret_file"),
               "email": ("username_env", "password_env", "password_file")}


class _Unresolved(Exception):
    def __init__(self, reason: str, hint: str | None) -> None:
        super().__init__(reason)
        self.reason, self.hint = reason, hint


def _resolve(env: str | None, file: str | None, policy: Any) -> str | None:
    if env is not None:
        value = os.environ.get(env)
        if not value:
            state = "is not set" if value is None else "is empty"
            raise _Unresolved(f"environment variable {env} {state}",
                              f"export {env} in the daemon's environment")
        return value
    if file is not None:
        path = policy.resolve_path(file)
        try:
            raw = read_bounded_bytes(path, str(path), what=SECRET_FILE, limit=SECRET_MAX_BYTES)
        except PolicyError as exc:
            raise _Unresolved(exc.message, exc.hint) from None
        try:
            value = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise _Unresolved(f"{path}: not UTF-8 text", "write the secret as UTF-8 text") from None
        if not value:
            raise _Unresolved(f"{path} is empty", "write the secret into the file")
        return value
    return None


def read_secret(env: str | None, file: str | None, policy: Any, what: str) -> str | None:
    """A secret from an environment variable or a file (relative to the policy file).

    The value is returned to the caller only; a DeliveryError names `what` and the variable
    or file, never the value. None when neither source is configured.
    """
    try:
        return _resolve(env, file, policy)
    except _Unresolved as exc:
        raise DeliveryError(f"{what}: {exc.reason}", hint=exc.hint) from None


@dataclass(frozen=True)
class MissingSecret:
    """A secret a receiver names that cannot be resolved now."""

    file: str          # the policy file
    policy: str
    receiver: str
    key: str           # e.g. "webhook.secret_env"
    reason: str
    hint: str | None = None

    def line(self) -> str:
        """One line naming the policy file, the receiver, the key and how to fix it."""
        text = f"{self.file}: receiver {self.receiver!r}: {self.key}: {self.reason}"
        return text if self.hint is None else f"{text}; {self.hint}"


def missing_secrets(policy: Any) -> list[MissingSecret]:
    """Resolve every secret every receiver of `policy` names; the ones that fail, in order.

    The values read are dropped at once: only the reasons are kept.
    """
    out: list[MissingSecret] = []
    for receiver in policy.receivers:
        cfg = getattr(receiver, receiver.kind)
        for key in SECRET_KEYS.get(receiver.kind, ()):
            source = getattr(cfg, key, None)
            if source is None:
                continue
            env, file = (source, None) if key.endswith("_env") else (None, source)
            try:
                _resolve(env, file, policy)
            except _Unresolved as exc:
                out.append(MissingSecret(str(policy.path), policy.name, receiver.name,
                                         f"{receiver.kind}.{key}", exc.reason, exc.hint))
    return out


__all__ = ["SECRET_FILE", "SECRET_KEYS", "SECRET_MAX_BYTES", "MissingSecret", "missing_secrets", "read_secret"]
