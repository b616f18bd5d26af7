"""What a campaign wrote into its output folder, so that a later run removes only its own files.

`OUTPUT/calibrate-manifest.json` records, for each campaign that wrote into the folder (its
name and the resolved path of its file), the curve files its last run wrote (each name
relative to OUTPUT, and the sha256 of its bytes). A curve a campaign no longer writes (a fit
that now fails, a task or metric taken out) is removed by the next run of the same campaign
only when that campaign's record lists it, no other campaign's record does, and its bytes are
still the ones recorded. Anything else in `curves/` (a hand-fitted curve, another campaign's,
a file edited since, the curves of a policies folder given as `--output`) is kept, and the run
says which and why.

Every write and removal stays in the folder that was checked: the output folder is resolved
when the campaign is loaded, `curves/` and the manifest may not be symbolic links, and stale
files are hashed and unlinked through a descriptor of `curves/` opened without following links.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monitor.errors import CampaignError, PolicyError
from monitor.files import FileKind, NotJsonError, read_bounded_json
from monitor.files import atomic_write_text

MANIFEST_NAME = "calibrate-manifest.json"
CURVES_DIR = "curves"
SCHEMA = "lstar-calibrate-manifest/1"
MANIFEST_FILE = FileKind("calibrate manifest", "calibrate manifests", "JSON")
_MANIFEST_MAX_BYTES = 16 << 20
_SHA256_HEX = frozenset("0123456789abcdef")
# What a run writes directly in OUTPUT (runner, plan, evaluate, outputs): none may be a link,
# so that no write follows one out of the folder.
_OWN_FOLDERS = (CURVES_DIR, "tmp", "lm_eval")
_OWN_FILES = (MANIFEST_NAME, "calibrate.duckdb", "calibrate.duckdb.wal", "plan.json", "scoring.log",
              "validation.json", "validation.md")


@dataclass(frozen=True)
class CampaignId:
    """Who wrote a file: a campaign's name and the resolved path of its campaign file."""

    name: str
    file: str

    def describe(self) -> str:
        return f"campaign {self.name} ({self.file})"


@dataclass
class Cleanup:
    """What a run did with the files of `curves/` it did not write: removed, or kept and why."""

    removed: list[Path] = field(default_factory=list)
    kept: list[tuple[Path, str]] = field(default_factory=list)


def output_problem(out: Path) -> str | None:
    """Why the output folder cannot take the campaign's writes as it stands, or None.

    `curves/` (and the run's other folders) must be real folders, and the manifest (and the
    run's other files) regular files, or absent: neither a write nor a removal may follow a
    link out of the folder."""
    for name in (*_OWN_FOLDERS, *_OWN_FILES):
        path = out / name
        if path.is_symlink():
            return f"{path} is a symbolic link (to {os.readlink(path)}); the campaign writes only into " \
                   "the output folder itself; remove the link"
        if name in _OWN_FOLDERS and path.exists() and not path.is_dir():
            return f"{path} exists and is not a folder; move it away"
        if name in _OWN_FILES and path.exists() and not path.is_file():
            return f"{path} exists and is not a regular file; move it away"
    return None


def prepare_output(out: Path) -> None:
    """Create the output folder and `curves/` after checking that the path is still the real
    one checked when the campaign was loaded (no component swapped for a link since)."""
    try:
        real = out.resolve()
    except (OSError, RuntimeError) as exc:
        raise CampaignError(f"output folder {out}: cannot resolve it ({exc})") from None
    if real != out:
        raise CampaignError(f"output folder {out} now leads to {real} through a symbolic link; nothing written",
                            hint="point the campaign's output at a real folder")
    problem = output_problem(out)
    if problem is not None:
        raise CampaignError(f"output folder {out}: {problem}")
    (out / CURVES_DIR).mkdir(parents=True, exist_ok=True)


def _hash_fd(fd: int) -> str:
    digest = hashlib.sha256()
    while chunk := os.read(fd, 1 << 20):
        digest.update(chunk)
    return digest.hexdigest()


def file_sha256(folder_fd: int, name: str) -> str | None:
    """sha256 of a regular file in the folder of `folder_fd`; None for anything else (a link,
    a FIFO, a device, a folder) or a file that cannot be read."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder_fd)
    except OSError:
        return None
    try:
        return _hash_fd(fd) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _open_curves(out: Path) -> int:
    try:
        return os.open(out / CURVES_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise CampaignError(f"cannot open {out / CURVES_DIR}: {exc.strerror or exc} (it must be a real "
                            "folder, not a link)") from None


def written_hashes(out: Path, names: list[str]) -> dict[str, str]:
    """{'curves/<name>': sha256} of the curve files this run wrote."""
    fd = _open_curves(out)
    try:
        hashes = {}
        for name in names:
            sha = file_sha256(fd, name)
            if sha is None:
                raise CampaignError(f"{out / CURVES_DIR / name}: the curve just written is not a regular file")
            hashes[f"{CURVES_DIR}/{name}"] = sha
        return hashes
    finally:
        os.close(fd)


def _valid_entry(entry: Any) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("campaign"), str) and isinstance(entry.get("file"), str)
            and isinstance(entry.get("files"), dict)
            and all(isinstance(k, str) and isinstance(v, str) and len(v) == 64 and set(v) <= _SHA256_HEX
                    for k, v in entry["files"].items()))


def read_manifest(out: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The manifest's campaign records, and why it could not be read (None when it could,
    or when there is none yet). A record that is not well formed is left out."""
    path = out / MANIFEST_NAME
    if not path.exists() and not path.is_symlink():
        return [], None
    try:
        data, _ = read_bounded_json(path, str(path), what=MANIFEST_FILE, limit=_MANIFEST_MAX_BYTES)
    except PolicyError as exc:
        return [], exc.message
    except NotJsonError as exc:
        return [], f"{path}: not JSON ({exc})"
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("campaigns"), list):
        return [], f"{path}: not a {SCHEMA} manifest"
    return [e for e in data["campaigns"] if _valid_entry(e)], None


def _owner(entry: dict[str, Any]) -> CampaignId:
    return CampaignId(entry["campaign"], entry["file"])


def remove_stale(out: Path, me: CampaignId, written: dict[str, str]) -> Cleanup:
    """Remove the curve files an earlier run of campaign `me` recorded and this run did not
    write (`written`: name → sha256), when their bytes are still the recorded ones and no other
    campaign records them; keep every other file of `curves/` and say why. Then record
    `written` as `me`'s files in the manifest (atomically), keeping the other campaigns' records."""
    entries, unreadable = read_manifest(out)
    mine: dict[str, str] = {}
    others: dict[str, list[tuple[CampaignId, str]]] = {}
    for entry in entries:
        if _owner(entry) == me:
            mine.update(entry["files"])
        else:
            for name, sha in entry["files"].items():
                others.setdefault(name, []).append((_owner(entry), sha))
    cleanup = Cleanup()
    fd = _open_curves(out)
    try:
        for name in sorted(os.listdir(fd)):
            rel = f"{CURVES_DIR}/{name}"
            if not name.endswith(".json") or name.startswith(".") or rel in written:
                continue
            path = out / CURVES_DIR / name
            why = _reason_to_keep(rel, mine, others, me, unreadable, fd, name)
            if why is not None:
                cleanup.kept.append((path, why))
                continue
            try:
                os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                cleanup.kept.append((path, f"could not be removed: {exc.strerror or exc}"))
                continue
            cleanup.removed.append(path)
    finally:
        os.close(fd)
    record = {"campaign": me.name, "file": me.file, "files": dict(sorted(written.items()))}
    kept = [e for e in entries if _owner(e) != me]
    try:
        atomic_write_text(out / MANIFEST_NAME, json.dumps({"schema": SCHEMA, "campaigns": [*kept, record]},
                                                          indent=2) + "\n")
    except OSError as exc:
        raise CampaignError(f"cannot write {out / MANIFEST_NAME}: {exc.strerror or exc}",
                            hint="it must be a regular file the campaign can replace") from None
    return cleanup


def _reason_to_keep(rel: str, mine: dict[str, str], others: dict[str, list[tuple[CampaignId, str]]],
                    me: CampaignId, unreadable: str | None, fd: int, name: str) -> str | None:
    """Why a curve file this run did not write stays, or None when it is this campaign's to remove."""
    if rel not in mine:
        if rel in others:
            return f"written by {others[rel][0][0].describe()}, not by this campaign"
        if unreadable is not None:
            return f"the record of written files is unreadable ({unreadable}), so nothing is removed"
        return f"not written by {me.describe()} (not in its record {MANIFEST_NAME})"
    sha = file_sha256(fd, name)
    if sha is None:
        return "not a regular file"
    if sha != mine[rel]:
        return "changed since this campaign wrote it"
    # Another campaign that wrote these very bytes still counts on them; one whose copy was
    # overwritten since (another sha) does not.
    sharing = [owner for owner, recorded in others.get(rel, []) if recorded == sha]
    if sharing:
        return f"also written by {sharing[0].describe()}"
    return None


__all__ = ["CURVES_DIR", "MANIFEST_NAME", "CampaignId", "Cleanup", "file_sha256", "output_problem",
           "prepare_output", "read_manifest", "remove_stale", "written_hashes"]
