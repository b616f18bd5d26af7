"""The layout of a safetensors file, checked exactly from its header.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON header,
then the tensor data. The header maps each tensor to a dtype, a shape and `[begin, end)`
offsets into the data. A file is valid only when its tensors tile the data exactly: every
span holds shape x dtype bytes, the spans run contiguously from 0 with no gap or overlap,
and `8 + N + end of the last span` is the file's size. A truncated download and a file
with bytes appended after the last tensor both fail here, with the numbers, before a
single weight byte is read.

The rules follow the `safetensors` library's own checks (which refuse such files at load
time with a bare `SafetensorError`), so what passes here also opens there. The gate runs
them on headers read by range requests; the loader on local files.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# huggingface_hub's limit (SAFETENSORS_MAX_HEADER_LENGTH); the library itself allows 100 MB.
MAX_HEADER_BYTES = 25_000_000
# Bytes per element of the safetensors dtypes we accept.
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
               "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1,
               "BOOL": 1}
_USIZE_MAX = 2**64 - 1


class LayoutError(ValueError):
    """A safetensors header or layout that is not valid; the message says what is wrong."""


@dataclass(frozen=True)
class SafetensorsHeader:
    """A parsed header: its length on disk, the tensor entries and the `__metadata__`."""

    header_len: int
    tensors: dict[str, dict[str, Any]]
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Layout:
    """What a valid header declares: element counts per dtype and where the data ends."""

    n_params: int
    dtypes: dict[str, int]
    data_end: int

    def file_size(self, header_len: int) -> int:
        """The exact size of a file with this layout and a header of `header_len` bytes."""
        return 8 + header_len + self.data_end


def header_length(prefix: bytes, file_size: int | None = None) -> int:
    """The header length N from the file's first 8 bytes, checked against the limits."""
    if len(prefix) < 8:
        raise LayoutError(f"the file has {len(prefix)} bytes, fewer than the 8-byte header length")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > MAX_HEADER_BYTES:
        raise LayoutError(f"header length {n:,} is over the {MAX_HEADER_BYTES:,}-byte limit")
    if file_size is not None and 8 + n > file_size:
        raise LayoutError(f"header length {n:,} runs past the end of the {file_size:,}-byte file")
    return n


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise LayoutError(f"duplicate key {key!r} in the header")
        seen[key] = value
    return seen


def parse_header(raw: bytes, header_len: int) -> SafetensorsHeader:
    """Parse the N header bytes: a JSON object of tensor entries plus optional `__metadata__`."""
    if len(raw) != header_len:
        raise LayoutError(f"the header is cut short: {len(raw):,} of {header_len:,} bytes")
    try:
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, RecursionError, ValueError) as exc:
        if isinstance(exc, LayoutError):
            raise
        raise LayoutError(f"the header is not valid JSON: {' '.join(str(exc).split())[:200]}") from None
    if not isinstance(data, dict):
        raise LayoutError("the header is not a JSON object")
    metadata = data.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise LayoutError("__metadata__ must map strings to strings")
    for name, entry in data.items():
        if not isinstance(entry, dict):
            raise LayoutError(f"tensor {name!r} is not a JSON object")
    return SafetensorsHeader(header_len, data, metadata)


def read_local_header(path: str | Path) -> SafetensorsHeader:
    """The header of a safetensors file on disk (only the header bytes are read)."""
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as fh:
        n = header_length(fh.read(8), size)
        return parse_header(fh.read(n), n)


def tensor_layout(header: SafetensorsHeader) -> Layout:
    """Validate every tensor entry and that the spans tile the data buffer from byte 0.

    Raises LayoutError naming the first tensor (or byte) at fault.
    """
    n_params = 0
    dtypes: dict[str, int] = {}
    spans: list[tuple[int, int]] = []
    for name, entry in header.tensors.items():
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in DTYPE_BYTES:
            raise LayoutError(f"tensor {name!r} has unsupported dtype {dtype!r}")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise LayoutError(f"tensor {name!r} has shape {shape!r}")
        numel = 1
        for d in shape:
            numel *= d
            if numel * DTYPE_BYTES[dtype] > _USIZE_MAX:  # the library computes sizes in 64 bits
                raise LayoutError(f"tensor {name!r} has shape {shape} whose size overflows 64 bits")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                and 0 <= offsets[0] <= offsets[1] and offsets[1] - offsets[0] == numel * DTYPE_BYTES[dtype]):
            raise LayoutError(f"tensor {name!r} has data_offsets {offsets!r} that do not match shape "
                              f"{shape} x {dtype}")
        spans.append((offsets[0], offsets[1]))
        n_params += numel
        dtypes[dtype] = dtypes.get(dtype, 0) + numel
    # The format requires the tensors to tile the data buffer: no overlaps, no holes.
    position = 0
    for begin, end in sorted(spans):
        if begin != position:
            raise LayoutError(f"tensor data {'overlaps' if begin < position else 'leaves a hole'} at "
                              f"byte {min(begin, position):,}")
        position = end
    return Layout(n_params, dtypes, position)


def check_file_size(header: SafetensorsHeader, layout: Layout, file_size: int) -> None:
    """Refuse a file that is not exactly 8 + header + tensor data bytes long."""
    need = layout.file_size(header.header_len)
    if file_size < need:
        raise LayoutError(f"truncated: the header and tensors need {need:,} bytes but the file has "
                          f"{file_size:,}")
    if file_size > need:
        raise LayoutError(f"padded: the file has {file_size:,} bytes, {file_size - need:,} after the "
                          f"last tensor (the header and tensors cover {need:,})")


def check_local_file(path: str | Path) -> tuple[SafetensorsHeader, Layout]:
    """Read and validate a local safetensors file's header and exact size."""
    path = Path(path)
    header = read_local_header(path)
    layout = tensor_layout(header)
    check_file_size(header, layout, path.stat().st_size)
    return header, layout
