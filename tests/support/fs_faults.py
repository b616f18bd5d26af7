"""Real file-system faults for tests: a read-only folder and a full disk.

Each wraps a command so that it runs in a user and mount namespace of its own (`unshare
-Urm`), where the folder is bind-mounted read-only or covered by a tiny tmpfs that is
filled up. The fault is the kernel's (EROFS, ENOSPC), not a mock; it needs no root (root
ignores file modes, so `chmod` would not do) and no mount is visible outside the command.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

_READ_ONLY = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
_FULL = ('mount -t tmpfs -o size="$2" tmpfs "$1" && { [ -z "$3" ] || cp -a "$3"/. "$1"/; } && '
         '{ cat /dev/zero > "$1/.fill" 2>/dev/null; true; } && shift 3 && exec "$@"')


@functools.lru_cache(maxsize=1)
def namespaces_work() -> bool:
    """Whether this machine lets an unprivileged user and mount namespace mount things."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    try:
        done = subprocess.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def read_only(folder: Path, argv: Sequence[str]) -> list[str]:
    """`argv`, run where `folder` (which must exist) is a read-only mount of itself."""
    return ["unshare", "-Urm", "sh", "-c", _READ_ONLY, "sh", str(folder), *argv]


def full_disk(folder: Path, argv: Sequence[str], *, seed: Path | None = None, size: str = "1m") -> list[str]:
    """`argv`, run where `folder` (which must exist) is a `size` tmpfs holding a copy of
    `seed`'s contents, then filled to the last byte."""
    return ["unshare", "-Urm", "sh", "-c", _FULL, "sh", str(folder), size, str(seed or ""), *argv]


__all__ = ["namespaces_work", "read_only", "full_disk"]
