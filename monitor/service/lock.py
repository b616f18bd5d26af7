"""The single-instance lock of a state directory: one daemon per database (docs/reliability.md row 4)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from monitor.errors import StoreError
from monitor.store import storage_error

LOCK_NAME = "lstar.lock"


class StateLock:
    """An exclusive `flock` on STATE/lstar.lock; the file holds the owner's pid."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_NAME
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise StoreError naming the pid that holds it (or saying why the
        state directory cannot be written)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise storage_error(self.path.parent, exc, doing="taking the daemon lock") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreError(f"another daemon (pid {holder}) holds {self.path}",
                             hint="stop it first, or give this one another --state directory") from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)  # closing drops the flock
            raise storage_error(self.path.parent, exc, doing="taking the daemon lock") from exc
        self.fd = fd

    def holder(self) -> str | None:
        """The pid of a live daemon holding the lock, "unknown" if its file does not say,
        None when nobody holds it. Takes nothing and writes nothing."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                text = os.read(fd, 64).decode(errors="replace").strip()
                return text if text.isdigit() else "unknown"
            except OSError:
                return None
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
