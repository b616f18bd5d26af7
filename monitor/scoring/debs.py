"""Debian packages as pinned text sources: fetch a .deb with `apt-get download` (or take it
from a cache folder), check it against a pin (package, version, sha256), and read the regular
files of its data archive in memory.

A .deb is untrusted input. Nothing is unpacked to disk: `dpkg-deb --fsys-tarfile` streams the
data archive and each member is read with size limits. Links (symbolic or hard) and special
files are skipped and counted, never followed; a member whose path is absolute or climbs out of
the archive with `..` makes the whole package refused.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from monitor.errors import CorpusError
from monitor.files import file_sha256

MAX_DEB_BYTES = 256 * 2**20         # the .deb file itself
MAX_MEMBER_BYTES = 128 * 2**20      # one file inside it (compressed form, as stored)
MAX_READ_BYTES = 512 * 2**20        # all files read from one package together
MAX_MEMBERS = 200_000               # entries of the data archive
_PACKAGE_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]{0,99}$")
_VERSION_RE = re.compile(r"^[A-Za-z0-9.+~:-]{1,100}$")


@dataclass(frozen=True)
class Deb:
    """A .deb on disk with its control fields and sha256."""

    path: Path
    package: str
    version: str
    sha256: str


@dataclass
class DebFiles:
    """Regular files read from a .deb (path relative to the archive root -> bytes)."""

    deb: Deb
    files: dict[str, bytes] = field(default_factory=dict)
    skipped_links: list[str] = field(default_factory=list)
    skipped_other: int = 0


def check_package_name(name: str) -> str:
    """A Debian package name, or a CorpusError naming it."""
    if not _PACKAGE_RE.match(name):
        raise CorpusError(f"{name!r} is not a Debian package name",
                          hint="names are lower-case letters, digits and + . -")
    return name



def _run(args: list[str], *, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(args, cwd=cwd, capture_output=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise CorpusError(f"{args[0]} is not installed", hint="building the pool needs Debian's "
                          "dpkg-deb and apt-get") from None
    except subprocess.TimeoutExpired:
        raise CorpusError(f"{' '.join(args[:3])} took longer than {timeout:.0f} s") from None


def inspect_deb(path: Path) -> Deb:
    """Read Package and Version from a .deb's control file (via dpkg-deb) and hash it."""
    path = Path(path)
    if not path.is_file() or path.is_symlink():
        raise CorpusError(f"{path} is not a regular file")
    if path.stat().st_size > MAX_DEB_BYTES:
        raise CorpusError(f"{path} is larger than {MAX_DEB_BYTES // 2**20} MiB",
                          hint="the pool reads documentation packages, not large binaries")
    proc = _run(["dpkg-deb", "--field", str(path), "Package", "Version"])
    if proc.returncode != 0:
        msg = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise CorpusError(f"{path} is not a readable .deb ({msg[-1] if msg else 'dpkg-deb failed'})")
    fields = dict(line.split(": ", 1) for line in proc.stdout.decode("utf-8", "replace").splitlines()
                  if ": " in line)
    package, version = fields.get("Package", ""), fields.get("Version", "")
    if not _PACKAGE_RE.match(package) or not _VERSION_RE.match(version):
        raise CorpusError(f"{path}: control fields Package={package!r} Version={version!r} "
                          "are not a package name and version")
    return Deb(path=path, package=package, version=version, sha256=file_sha256(path))


def _cached(cache: Path, package: str, version: str | None) -> list[Deb]:
    found = []
    for path in sorted(cache.glob(f"{package}_*.deb")):
        if path.is_symlink() or not path.is_file():
            continue
        deb = inspect_deb(path)
        if deb.package == package and (version is None or deb.version == version):
            found.append(deb)
    return found


def fetch_deb(package: str, cache: Path, version: str | None = None) -> Deb:
    """The .deb of `package` (at `version` when given) from `cache`, downloading it there
    with `apt-get download` when it is missing."""
    check_package_name(package)
    if version is not None and not _VERSION_RE.match(version):
        raise CorpusError(f"version {version!r} of {package} is not a Debian version")
    cache.mkdir(parents=True, exist_ok=True)
    found = _cached(cache, package, version)
    if not found:
        spec = package if version is None else f"{package}={version}"
        tmp = Path(tempfile.mkdtemp(prefix=".download.", dir=cache))
        try:
            proc = _run(["apt-get", "download", spec], cwd=tmp)
            if proc.returncode != 0:
                msg = proc.stderr.decode("utf-8", "replace").strip().splitlines()
                raise CorpusError(f"apt-get download {spec} failed: {msg[-1] if msg else proc.returncode}",
                                  hint="run `apt-get update`, or put the .deb in the cache folder")
            for path in sorted(tmp.glob("*.deb")):
                os.replace(path, cache / path.name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        found = _cached(cache, package, version)
    if not found:
        raise CorpusError(f"no .deb of {package}{'' if version is None else ' ' + version} in {cache}")
    if len(found) > 1:
        raise CorpusError(f"{cache} holds {len(found)} .debs of {package} "
                          f"({', '.join(d.version for d in found)})",
                          hint="pin one with --pins, or remove the others from the cache")
    return found[0]


def check_pin(deb: Deb, pins: Mapping[str, tuple[str, str]], pins_path: Path) -> None:
    """Refuse a .deb whose version or sha256 differs from its pin."""
    if deb.package not in pins:
        raise CorpusError(f"package {deb.package} is not pinned in {pins_path}",
                          hint=f"pinned packages: {', '.join(sorted(pins))}")
    version, sha = pins[deb.package]
    if deb.version != version:
        raise CorpusError(f"package {deb.package}: {deb.path.name} is version {deb.version}, "
                          f"{pins_path} pins {version}", hint="fetch the pinned version")
    if deb.sha256 != sha:
        raise CorpusError(f"package {deb.package} {deb.version}: {deb.path.name} has sha256 "
                          f"{deb.sha256[:16]}…, {pins_path} pins {sha[:16]}…",
                          hint="the file differs from the one the pool was built from; "
                               "delete it from the cache and fetch it again")


def safe_member_path(name: str, deb: Deb) -> str:
    """The archive path without its leading './', or a CorpusError for an unsafe one."""
    path = PurePosixPath(name)
    if name.startswith("/") or path.is_absolute() or ".." in path.parts:
        raise CorpusError(f"{deb.path.name} ({deb.package}): archive member {name!r} points "
                          "outside the package root", hint="the .deb is malformed or hostile: "
                          "refusing to read it")
    parts = [p for p in path.parts if p not in (".", "")]
    return "/".join(parts)


def read_deb(deb: Deb, wanted: Callable[[str], bool]) -> DebFiles:
    """Read the regular files of `deb`'s data archive whose path `wanted` accepts.

    Every member path is checked (an unsafe one refuses the package even if not wanted); links
    and special files are skipped and counted; sizes are bounded.
    """
    out = DebFiles(deb=deb)
    proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb.path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    completed = False
    try:
        _read_members(proc.stdout, deb, wanted, out)
        # drain the archive's trailing padding so dpkg-deb ends cleanly (bounded)
        drained = 0
        while block := proc.stdout.read(1 << 16):
            drained += len(block)
            if drained > 1 << 20:
                raise CorpusError(f"{deb.path.name}: data after the end of the tar archive")
        completed = True
    except tarfile.TarError as exc:
        raise CorpusError(f"{deb.path.name}: data archive is not a valid tar ({exc})") from None
    finally:
        proc.stdout.close()
        if not completed:
            proc.kill()
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            err = b""
    if proc.returncode != 0:
        msg = err.decode("utf-8", "replace").strip().splitlines()
        raise CorpusError(f"{deb.path.name}: dpkg-deb --fsys-tarfile failed "
                          f"({msg[-1] if msg else proc.returncode})")
    return out


# A GNU long name or a PAX header is read whole into memory before its member can be judged:
# bounded here, where tarfile reads it (a 3 MB .deb could otherwise name a member in 768 MiB).
MAX_LONG_NAME_BYTES = 4096
MAX_PAX_BYTES = 1 << 20
# Everything the data archive may decompress to, wanted or not (a compression bomb).
MAX_STREAM_BYTES = 2 * 2**30


class _BoundedTarInfo(tarfile.TarInfo):
    """Refuses long-name and PAX headers over their bounds before reading them."""

    def _proc_gnulong(self, tarfile_):  # type: ignore[override]
        if self.size > MAX_LONG_NAME_BYTES:
            raise tarfile.HeaderError(f"a long member name of {self.size:,} bytes")
        return super()._proc_gnulong(tarfile_)

    def _proc_pax(self, tarfile_):  # type: ignore[override]
        if self.size > MAX_PAX_BYTES:
            raise tarfile.HeaderError(f"an extended header of {self.size:,} bytes")
        return super()._proc_pax(tarfile_)


class _BoundedStream:
    """The archive's byte stream, refused once more than MAX_STREAM_BYTES have been read."""

    def __init__(self, raw) -> None:
        self.raw = raw
        self.read_bytes = 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size if size is not None and size >= 0 else 1 << 20)
        self.read_bytes += len(data)
        if self.read_bytes > MAX_STREAM_BYTES:
            raise tarfile.ReadError(f"the data archive decompresses to more than {MAX_STREAM_BYTES // 2**30} GiB")
        return data


def _read_members(stream, deb: Deb, wanted: Callable[[str], bool], out: DebFiles) -> None:
    total = 0
    with tarfile.open(fileobj=_BoundedStream(stream), mode="r|", tarinfo=_BoundedTarInfo) as tar:
        for n, member in enumerate(tar):
            if n >= MAX_MEMBERS:
                raise CorpusError(f"{deb.path.name}: more than {MAX_MEMBERS} archive members")
            rel = safe_member_path(member.name, deb)
            if member.issym() or member.islnk():
                out.skipped_links.append(rel)
                continue
            if member.isdir():
                continue
            if not member.isfile():
                out.skipped_other += 1
                continue
            if not wanted(rel):
                continue
            if member.size > MAX_MEMBER_BYTES or total + member.size > MAX_READ_BYTES:
                raise CorpusError(f"{deb.path.name}: {rel} ({member.size:,} B) exceeds the size "
                                  f"limit ({MAX_MEMBER_BYTES // 2**20} MiB a file, "
                                  f"{MAX_READ_BYTES // 2**20} MiB a package)")
            handle = tar.extractfile(member)
            data = handle.read() if handle is not None else b""
            total += len(data)
            out.files[rel] = data
