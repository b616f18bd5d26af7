"""Bounded reads from the Hub: byte budgets enforced while bytes arrive.

Every byte from the Hub is hostile, and the size the Hub announces is only a claim. Two
seams keep memory and disk within what was budgeted even when a server sends more:

- `capped_progress(limit)` is a progress-bar class for huggingface_hub's downloads. The
  client calls `update(len(chunk))` before it writes each chunk, so raising there stops a
  download at the first chunk past `limit`; the client then deletes its temporary file.
- `read_range` reads a byte range (a safetensors header) by a streamed GET and stops after
  the bytes it asked for, even if the server ignores the Range header and sends the file.

The progress-bar cap cannot stop a transfer on the Xet path: hf_xet calls the progress
callback from its own thread and only prints what the callback raises (docs/hub-api.md).
So every capped download is also measured once it lands (`refuse_oversized`): more bytes
on disk than allowed is refused, and the files this download wrote are removed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from monitor.errors import IntegrityError

# How much of an error response is read to describe it.
ERROR_BODY_BYTES = 64 << 10


class DownloadTooLarge(Exception):
    """A download went past its byte budget and was stopped."""

    def __init__(self, what: str, limit: int, received: int) -> None:
        self.what, self.limit, self.received = what, limit, received
        super().__init__(f"{what}: the Hub sent more than the {limit:,} bytes allowed "
                         f"({received:,} bytes by the time the download was stopped)")


def capped_progress(limit: int, what: str) -> type:
    """A huggingface_hub progress-bar class that raises DownloadTooLarge past `limit` bytes.

    Only byte-counting bars are capped (huggingface_hub also counts files with the same
    class in `snapshot_download`); several threads may update one bar.
    """
    from huggingface_hub.utils import tqdm as hf_tqdm

    class CappedProgress(hf_tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._counts_bytes = kwargs.get("unit") == "B"
            self._received = 0
            self._count_lock = threading.Lock()
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            if self._counts_bytes:
                with self._count_lock:
                    self._received += int(n or 0)
                    received = self._received
                if received > limit:
                    raise DownloadTooLarge(what, limit, received)
            return super().update(n)

    return CappedProgress


def read_range(url: str, headers: dict[str, str], start: int, length: int, *,
               timeout: float) -> bytes:
    """Bytes `[start, start + length)` of `url`, never reading more than that from the wire.

    Raises what `hf_raise_for_status` raises for an error status (gated, not found, ...).
    Returns fewer bytes when the file is shorter.
    """
    import httpx2
    from huggingface_hub.utils import get_session, hf_raise_for_status

    wanted = {**headers, "Range": f"bytes={start}-{start + length - 1}"}
    with get_session().stream("GET", url, headers=wanted, timeout=timeout) as response:
        if response.status_code >= 400:
            body = _read_at_most(response, ERROR_BODY_BYTES)
            hf_raise_for_status(httpx2.Response(response.status_code, headers=response.headers,
                                                content=body, request=response.request))
        # A server that ignores the range answers 200 with the file from byte 0.
        skip = start if response.status_code == 200 else 0
        data = _read_at_most(response, skip + length)
    return data[skip:]


def read_page(url: str, headers: dict[str, str], limit: int) -> bytes:
    """The first `limit` bytes of an API answer (a listing's first page), by a streamed GET.

    Raises what `hf_raise_for_status` raises for an error status.
    """
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session, hf_raise_for_status

    with get_session().stream("GET", url, headers=headers, timeout=constants.HF_HUB_ETAG_TIMEOUT) as response:
        body = _read_at_most(response, limit if response.status_code < 400 else ERROR_BODY_BYTES)
        if response.status_code >= 400:
            hf_raise_for_status(httpx2.Response(response.status_code, headers=response.headers,
                                                content=body, request=response.request))
    return body


def _read_at_most(response: Any, limit: int) -> bytes:
    chunks: list[bytes] = []
    got = 0
    for chunk in response.iter_bytes():
        chunks.append(chunk[:limit - got])
        got += len(chunks[-1])
        if got >= limit:
            break
    return b"".join(chunks)


def cache_entries(cache_dir: Path, repo: str) -> set[Path]:
    """Every file and link a download of `repo` may add to the cache: the repo's folder and
    the cache-wide Xet blob store (`blobs/`), as they are before the download."""
    from huggingface_hub.file_download import repo_folder_name

    roots = (cache_dir / repo_folder_name(repo_id=repo, repo_type="model"), cache_dir / "blobs")
    return {Path(os.path.abspath(p)) for root in roots if root.is_dir() for p in root.rglob("*")
            if p.is_symlink() or p.is_file()}


def _link_chain(path: Path) -> list[Path]:
    """`path` and every link it goes through: snapshot link, repo blob, shared Xet blob."""
    chain = [path]
    while chain[-1].is_symlink() and len(chain) < 8:
        chain.append(Path(os.path.normpath(chain[-1].parent / os.readlink(chain[-1]))))
    return chain


def refuse_oversized(what: str, files: Iterable[Path], limit: int, cache_dir: Path, before: set[Path]) -> None:
    """Raise IntegrityError when `files` hold more than `limit` bytes on disk together.

    Each file's snapshot link and the blobs behind it are removed where this download wrote
    them (absent from `before`, inside `cache_dir`); what was cached before is left alone
    and named.
    """
    files = list(files)
    total = sum(f.stat().st_size for f in files if f.is_file())
    if total <= limit:
        return
    root = Path(os.path.abspath(cache_dir))
    kept: list[str] = []
    for f in files:
        chain = [Path(os.path.abspath(p)) for p in _link_chain(f)]
        if all(p in before for p in chain):
            kept.append(str(f))
        # A shared Xet blob comes with a `.refs` manifest listing the links to it.
        written = [p for p in chain + [Path(f"{p}.refs") for p in chain] if p not in before]
        for p in written:
            if p.is_relative_to(root):
                p.unlink(missing_ok=True)
    raise IntegrityError(
        f"{what}: {total:,} bytes on disk after the download, more than the {limit:,} allowed; "
        + ("the files it wrote were removed" if not kept else f"left in place (cached before): {', '.join(kept)}"),
        hint="the server sent more than it announced; the next attempt downloads again")
