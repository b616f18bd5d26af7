"""Bounded reads of small configuration files (policies, curves, watch rules, corpus slice
rules, lab records), treating every byte as hostile.

A file is read through one non-blocking descriptor that must be a regular file and yields
at most a limit (`POLICY_MAX_BYTES` unless the caller sets one), so a FIFO, a device, a
directory, a huge file or one that vanishes between listing and reading is an error naming
the file and the kind of file expected, never a hang, an unbounded read or a crash. Kept
below every stage, so that policy, curves, hub and scoring code can all read files this way
without importing each other. Small files are written the matching way, atomically
(`atomic_write_text`): a crash leaves the old file or the new one, never half of either.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monitor.errors import PolicyError

POLICY_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class FileKind:
    """What a file is meant to be, as the errors about it name it."""

    name: str      # "policy file": "… is a directory, not a policy file"
    plural: str    # "policy files": "policy files are limited to … bytes"
    format: str    # "YAML": "policy files are regular YAML files"
    too_large: str | None = None   # the fix for a file over the limit, when there is one


POLICY_FILE = FileKind("policy file", "policy files", "YAML")
# A task's `evaluate.file`, read by `lstar policy check`, at every policy load and by every
# evaluation the daemon runs: one bound for all of them.
TASK_FILE = FileKind("multiple-choice task file", "multiple-choice task files", "JSON-lines",
                     too_large="split it, or use kind lm_eval")
TASK_FILE_MAX_BYTES = 64 << 20

_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISSOCK, "a socket"))


def read_bounded_bytes(path: Path, label: str, *, what: FileKind = POLICY_FILE,
                       limit: int = POLICY_MAX_BYTES) -> bytes:
    """At most `limit` bytes of a regular file; raises PolicyError naming the file (`label`)
    and the kind of file expected (`what`) otherwise.

    Opened without blocking and checked on the open descriptor, so a FIFO, a device or a
    file swapped between listing and reading can neither hang the reader nor feed it
    endless bytes.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise PolicyError(f"{label}: cannot read: {exc.strerror or exc}",
                          hint="check that the file exists and is readable") from None
    try:
        info = os.fstat(fd)
        mode = info.st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
            raise PolicyError(f"{label}: is {kind}, not a {what.name}",
                              hint=f"{what.plural} are regular {what.format} files; rename or remove it")
        if info.st_size > limit:   # refused before reading a byte of it
            raise _too_large(label, what, limit, info.st_size)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise PolicyError(f"{label}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > limit:   # it grew while being read
        raise _too_large(label, what, limit, _size_of(path, size))
    return b"".join(chunks)


def _too_large(label: str, what: FileKind, limit: int, size: int) -> PolicyError:
    return PolicyError(f"{label}: file is {size:,} bytes; {what.plural} are limited to {limit:,} bytes",
                       hint=what.too_large)


def _size_of(path: Path, at_least: int) -> int:
    try:
        return max(path.stat().st_size, at_least)
    except OSError:
        return at_least


class NotJsonError(ValueError):
    """Bytes that are not UTF-8 JSON, or nest too deeply to decode; the message says why."""


def read_bounded_json(path: Path, label: str, *, what: FileKind, limit: int) -> tuple[Any, bytes]:
    """The JSON data of a file read by `read_bounded_bytes`, and the bytes it was decoded from.

    Raises PolicyError when the file cannot be read that way, and NotJsonError (with the
    decoder's reason on one line) when its bytes are not JSON.
    """
    raw = read_bounded_bytes(path, label, what=what, limit=limit)
    try:
        return json.loads(raw.decode("utf-8")), raw
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise NotJsonError(" ".join(str(exc).split())) from exc


def read_bounded_text(path: Path, label: str, *, what: FileKind = POLICY_FILE) -> str:
    """The file's text after the kind, size and encoding checks of `read_bounded_bytes`."""
    try:
        return read_bounded_bytes(path, label, what=what).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(f"{label}: not UTF-8 text (byte {exc.start})",
                          hint="save the file as UTF-8") from None


__all__ = ["POLICY_FILE", "file_sha256", "POLICY_MAX_BYTES", "TASK_FILE", "TASK_FILE_MAX_BYTES", "FileKind", "NotJsonError", "read_bounded_bytes",
           "read_bounded_json", "read_bounded_text"]


def atomic_write_text(path: Path, text: str) -> None:
    """Replace `path` with `text` so that a crash leaves either the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def file_sha256(path: Path) -> str:
    """sha256 (hex) of a file, read in 1 MiB blocks so a large wheel or model is never held whole."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
