"""Finding policy files in a folder and fingerprinting them.

A policy folder is listed by name (`*.yaml`, `*.yml`); each entry is later read with the
bounded reads of `monitor.files`, so a FIFO, a device or a directory named like a policy is
an error naming the file, never a hang.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from monitor.errors import PolicyError
from monitor.files import read_bounded_bytes

POLICY_SUFFIXES = (".yaml", ".yml")


def policy_files_in(folder: Path) -> list[Path]:
    """Every `*.yaml`/`*.yml` entry of `folder`, sorted; hidden names (editor locks) are skipped.

    Entries that are not regular files are listed too, so that loading them reports why
    (a directory or a FIFO named like a policy is a mistake to show, not to hide).
    """
    try:
        return sorted(p for p in folder.iterdir()
                      if p.suffix in POLICY_SUFFIXES and not p.name.startswith("."))
    except OSError:
        return []


def policy_fingerprint(paths: Sequence[Path]) -> str:
    """A digest of the files' names and contents (bounded reads): equal when nothing changed.

    A file that cannot be read contributes its error, so a change in why it fails counts too.
    """
    digest = hashlib.sha256()
    for path in paths:
        digest.update(str(path).encode() + b"\0")
        try:
            digest.update(b"+" + read_bounded_bytes(path, str(path)))
        except PolicyError as exc:
            digest.update(b"!" + exc.message.encode())
        digest.update(b"\0")
    return digest.hexdigest()


__all__ = ["POLICY_SUFFIXES", "policy_files_in", "policy_fingerprint"]
