"""The tokenizer families of lab v3 (docs/lab.md, "Families v3"): one tokenizer folder each.

`build_lab_families(OUT, pool=..., shared=...)` writes `OUT/<name>/` with `tokenizer.json`,
`tokenizer_config.json` and `provenance.json` (how it was made: the source file and its
sha256, the method and its parameters, the library versions) for every name of
`V3_FAMILY_NAMES`, in four kinds:

- `shared`: a real tokenizer of `../shared/tokenizers`, its files copied byte for byte;
- `mistral`: a vocabulary shipped in mistral-common 1.13.1's wheel (`mistral_common/data/`),
  converted (`monitor.lab.vocab_convert`); its ids equal mistral-common's own tokenizer's. The
  files are read from the installed package or, without installing it, from the pinned wheel
  itself (`mistral_data_from_wheel`, its sha256 checked);
- `trained`: a byte-level BPE trained with `tokenizers` on the pool's train split (the first
  `TRAIN_BYTES` of its documents in corpus order): every byte is a token, so the round trip is
  exact by construction. (A byte-level Unigram is not one: tokenizers 0.23's Unigram trainer
  gave a different file on each of five runs, even without parallelism, so it cannot be pinned.)
- `pruned`: the first K merges of a real byte-level BPE and the vocabulary they reach.

A rebuild from the same inputs writes the same bytes (`tests/test_lab_families.py`).
rwkv's World vocabulary is not a candidate: it is a greedy longest-match trie over the bytes of
the whole text, whose tokens cross spaces and newlines, and the only greedy model of
`tokenizers` (WordPiece) matches within one pre-tokenized word by trying every shorter
substring, O(n²) lookups in the length of the word; an exact expression needs the document as
one word, too slow to tokenize the lab's text.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import logging

from monitor.errors import LabError
from monitor.files import atomic_write_text, file_sha256

TRAIN_BYTES = 4_000_000          # text the trained families learn from (seconds per tokenizer)
EOS = "<|endoftext|>"
log = logging.getLogger(__name__)
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# Pre-tokenizers of the trained families: where a token may not cross.
PRE_TOKENIZERS = {
    "gpt2": "GPT-2's regex (a word keeps the space before it), then bytes",
    "digits": "every digit alone, then GPT-2's regex, then bytes",
    "words": "runs of spaces, runs of letters, runs of digits, other characters: no token begins with a space",
    "lines": "lines only (a token may hold several words and the spaces between them)",
}
MISTRAL_VERSION = "1.13.1"


@dataclass(frozen=True)
class FamilySpec:
    name: str
    kind: str                            # shared | mistral | trained | pruned
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FamilySource:
    """One built family: its folder (tokenizer.json, tokenizer_config.json, provenance.json)."""

    name: str
    kind: str
    folder: Path
    provenance: dict[str, Any]


def _shared(name: str) -> FamilySpec:
    return FamilySpec(name, "shared", {"folder": name})


def _trained(name: str, model: str, vocab_size: int, pre: str) -> FamilySpec:
    return FamilySpec(name, "trained", {"model": model, "vocab_size": vocab_size, "pre_tokenizer": pre})


def _pruned(base: str, keep: int) -> FamilySpec:
    return FamilySpec(f"{base}-merges-{keep // 1000}k", "pruned", {"base": base, "keep_merges": keep})


# The candidates in their pre-registered order: `distinct_families` keeps a family unless its
# boundary Jaccard with one kept before it reaches the cut-off, so earlier ones win.
V3_FAMILY_SPECS: tuple[FamilySpec, ...] = (
    *(_shared(n) for n in ("gpt2", "llama-2", "llama-3", "smollm2", "qwen2", "gpt-neox", "starcoder2", "gpt-4o")),
    FamilySpec("mistral-spm", "mistral", {"file": "tokenizer.model.v1", "format": "sentencepiece",
                                          "bos": "<s>", "eos": "</s>", "unk": "<unk>", "model_max_length": 32768}),
    FamilySpec("mistral-tekken", "mistral", {"file": "tekken_240718.json", "format": "tekken",
                                             "bos": "<s>", "eos": "</s>", "unk": "<unk>", "model_max_length": 131072}),
    _trained("pool-bpe-1k", "bpe", 1024, "gpt2"),
    _trained("pool-bpe-4k", "bpe", 4096, "gpt2"),
    _trained("pool-bpe-16k", "bpe", 16384, "gpt2"),
    _trained("pool-bpe-digits-8k", "bpe", 8192, "digits"),
    _trained("pool-bpe-words-8k", "bpe", 8192, "words"),
    _trained("pool-bpe-lines-8k", "bpe", 8192, "lines"),
    _trained("pool-bpe-lines-2k", "bpe", 2048, "lines"),
    _trained("pool-bpe-words-32k", "bpe", 32768, "words"),
    _trained("pool-bpe-lines-32k", "bpe", 32768, "lines"),
    _pruned("gpt2", 8000),
    _pruned("gpt-neox", 16000),
    _pruned("llama-3", 32000),
    _pruned("qwen2", 24000),
    _pruned("gpt-4o", 48000),
    _pruned("starcoder2", 8000),
    _pruned("mistral-tekken", 16000),
)
V3_FAMILY_NAMES: tuple[str, ...] = tuple(s.name for s in V3_FAMILY_SPECS)
SPEC_BY_NAME = {s.name: s for s in V3_FAMILY_SPECS}


def mistral_data_dir() -> Path:
    """mistral-common's data folder (its installed package), found without importing it."""
    spec = importlib.util.find_spec("mistral_common")
    if spec is None or not spec.submodule_search_locations:
        raise LabError("mistral-common is not installed: the mistral families convert its vocabulary files",
                       hint=f"pip install mistral-common=={MISTRAL_VERSION}, or pass --mistral-wheel "
                            f"{MISTRAL_WHEEL} (or --mistral-data DIR)")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


# The wheel the mistral families are read from when mistral-common is not installed (it pins
# numpy<2.4, so it lives only in the `lab` extra): `--mistral-wheel PATH` opens it as a zip,
# checks this sha256 and reads the two vocabulary files from it. The files, and so every family
# folder's bytes, are the same as from the installed package.
MISTRAL_WHEEL = f"mistral_common-{MISTRAL_VERSION}-py3-none-any.whl"
MISTRAL_WHEEL_SHA256 = "98b4d0755b8d90bf4691fa8f1b70cb3b4a8cd4dc1653c4ed08ef3d1c7d2c29af"
MISTRAL_WHEEL_MAX_BYTES = 64 << 20      # the 1.13.1 wheel is 6.6 MB
MISTRAL_FILE_MAX_BYTES = 64 << 20       # its largest vocabulary file (tekken) is 14.8 MB



def mistral_data_from_wheel(wheel: str | Path, dest: str | Path, *, sha256: str | None = None,
                            files: Sequence[str] | None = None) -> Path:
    """Write the mistral vocabulary files (`files`, default those of the mistral families) from
    the pinned mistral-common wheel into `dest` and return it, without installing the package.
    A wheel whose sha256 is not `sha256` (default: the pinned one), that is not a zip, or lacks a
    file is refused in one line."""
    import zipfile

    sha256 = sha256 or MISTRAL_WHEEL_SHA256

    wheel, dest = Path(wheel), Path(dest)
    hint = f"pass the {MISTRAL_WHEEL} wheel (pip download mistral-common=={MISTRAL_VERSION} --no-deps)"
    if not wheel.is_file():
        raise LabError(f"--mistral-wheel {wheel} is not a file", hint=hint)
    if wheel.stat().st_size > MISTRAL_WHEEL_MAX_BYTES:
        raise LabError(f"--mistral-wheel {wheel} is larger than {MISTRAL_WHEEL_MAX_BYTES} bytes", hint=hint)
    actual = file_sha256(wheel)
    if actual != sha256:
        raise LabError(f"--mistral-wheel {wheel} has sha256 {actual[:16]}…, the pinned {MISTRAL_WHEEL} has "
                       f"{sha256[:16]}…", hint=hint)
    names = list(files) if files is not None else [s.params["file"] for s in V3_FAMILY_SPECS if s.kind == "mistral"]
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(wheel) as z:
            for name in names:
                member = f"mistral_common/data/{name}"
                try:
                    info = z.getinfo(member)
                except KeyError:
                    raise LabError(f"--mistral-wheel {wheel} has no {member}", hint=hint) from None
                if info.file_size > MISTRAL_FILE_MAX_BYTES:
                    raise LabError(f"{wheel}: {member} is larger than {MISTRAL_FILE_MAX_BYTES} bytes", hint=hint)
                with z.open(info) as f:
                    data = f.read(MISTRAL_FILE_MAX_BYTES + 1)
                if len(data) > MISTRAL_FILE_MAX_BYTES:
                    raise LabError(f"{wheel}: {member} is larger than {MISTRAL_FILE_MAX_BYTES} bytes", hint=hint)
                (dest / name).write_bytes(data)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as exc:
        raise LabError(f"--mistral-wheel {wheel} cannot be read as a wheel: {str(exc)[:200]}", hint=hint) from None
    return dest


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _dump(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n"


def _pretty(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, indent=2, sort_keys=True) + "\n"


def _config(**tokens: Any) -> dict[str, Any]:
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **{k: v for k, v in tokens.items() if v is not None},
              "clean_up_tokenization_spaces": False}
    return config


def _versions() -> dict[str, str]:
    import tokenizers
    return {"tokenizers": tokenizers.__version__}


# ------------------------------------------------------------------ the four kinds
def _build_shared(spec: FamilySpec, folder: Path, shared: Path) -> dict[str, Any]:
    source = shared / "tokenizers" / spec.params["folder"]
    if not (source / "tokenizer.json").is_file():
        raise LabError(f"family {spec.name}: {source}/tokenizer.json is missing",
                       hint="pass --shared DIR, the shared data folder with tokenizers/")
    files = {}
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (source / name).is_file():
            shutil.copyfile(source / name, folder / name)
            files[name] = sha256_file(source / name)
    return {"method": "copied byte for byte from the shared tokenizers",
            "source": {"path": f"tokenizers/{spec.params['folder']}", "files": files},
            "upstream": json.loads((source / "provenance.json").read_text(encoding="utf-8"))
            if (source / "provenance.json").is_file() else None}


def _build_mistral(spec: FamilySpec, folder: Path, mistral_data: Path) -> dict[str, Any]:
    from monitor.lab.vocab_convert import spm_bpe_tokenizer, tekken_tokenizer

    p = spec.params
    source = mistral_data / p["file"]
    if p["format"] == "sentencepiece":
        data, facts = spm_bpe_tokenizer(source), {}
        method = ("SentencePiece BPE .model read field by field; vocabulary and scores as they are, a merge for "
                  "every split of a piece into two pieces, ranked by the piece's score (transformers' "
                  "LlamaConverter); Llama-style pipeline: prepend and replace spaces by U+2581, byte fallback")
    else:
        data, facts = tekken_tokenizer(source)
        method = ("Tekken ranks to a byte-level BPE: id = rank + special tokens, a merge for every split of a "
                  "token into two lower-ranked tokens, ranked by the token's rank (transformers' "
                  "TikTokenConverter); Tekken's own split pattern, then bytes")
    (folder / "tokenizer.json").write_text(_dump(data), encoding="utf-8")
    config = _config(bos_token=p["bos"], eos_token=p["eos"], unk_token=p["unk"],
                     model_max_length=p["model_max_length"])
    (folder / "tokenizer_config.json").write_text(_pretty(config), encoding="utf-8")
    return {"method": method, "facts": facts,
            "source": {"package": f"mistral-common=={MISTRAL_VERSION}", "path": f"mistral_common/data/{p['file']}",
                       "sha256": sha256_file(source)},
            "verified": "ids equal mistral-common's own tokenizer on calib-v0 (tests/test_lab_families.py)"}


def training_texts(pool: Path, max_bytes: int = TRAIN_BYTES) -> tuple[list[str], dict[str, Any]]:
    """The pool's train documents in corpus order up to `max_bytes` of UTF-8 (the last one cut)."""
    from monitor.lab.pool import load_pool

    loaded = load_pool(pool)
    texts, size = [], 0
    for doc in loaded.train.documents:
        if size >= max_bytes:
            break
        texts.append(doc.text)
        size += len(doc.text.encode("utf-8"))
    return texts, {"train_sha256": loaded.train.sha256, "documents": len(texts), "bytes": size,
                   "selection": f"train split documents in corpus order until {max_bytes} bytes"}


def _pre_tokenizer(kind: str):
    from tokenizers import Regex, pre_tokenizers as pt

    byte_level = pt.ByteLevel(add_prefix_space=False, use_regex=False)
    gpt2 = pt.Split(Regex(GPT2_PATTERN), behavior="isolated")
    if kind == "gpt2":
        return pt.Sequence([gpt2, byte_level])
    if kind == "digits":
        return pt.Sequence([pt.Digits(individual_digits=True), gpt2, byte_level])
    if kind == "words":
        return pt.Sequence([pt.Split(Regex(r"\s+|\p{L}+|\p{N}+|[^\s\p{L}\p{N}]"), behavior="isolated"), byte_level])
    if kind == "lines":
        return pt.Sequence([pt.Split(Regex(r"[^\n]*\n|[^\n]+"), behavior="isolated"), byte_level])
    raise LabError(f"unknown pre-tokenizer {kind!r}", hint=f"one of {', '.join(PRE_TOKENIZERS)}")


def _build_trained(spec: FamilySpec, folder: Path, texts: list[str], text_facts: dict[str, Any]) -> dict[str, Any]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    p = spec.params
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE())
    trainer = trainers.BpeTrainer(vocab_size=p["vocab_size"], min_frequency=2, special_tokens=[EOS],
                                  initial_alphabet=alphabet, show_progress=False)
    tok.pre_tokenizer = _pre_tokenizer(p["pre_tokenizer"])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainer)
    data = json.loads(tok.to_str())
    missing = set(alphabet) - set(tok.get_vocab())
    if missing:
        raise LabError(f"family {spec.name}: training left out {len(missing)} byte characters")
    (folder / "tokenizer.json").write_text(_dump(data), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(_pretty(_config(eos_token=EOS)), encoding="utf-8")
    return {"method": f"byte-level {p['model'].upper()} trained with tokenizers on the pool's train split "
                      f"(every byte is a token; min_frequency 2)",
            "parameters": dict(p), "pre_tokenizer": PRE_TOKENIZERS[p["pre_tokenizer"]],
            "training_text": text_facts, "vocab_size": tok.get_vocab_size()}


def _build_pruned(spec: FamilySpec, folder: Path, built: Mapping[str, Path]) -> dict[str, Any]:
    from monitor.lab.vocab_convert import prune_byte_level_bpe

    base = spec.params["base"]
    if base not in built:
        raise LabError(f"family {spec.name} prunes {base}, which must be built before it",
                       hint=f"build {base} too (list it before {spec.name})")
    source = built[base]
    data = prune_byte_level_bpe(json.loads((source / "tokenizer.json").read_text(encoding="utf-8")),
                                spec.params["keep_merges"])
    (folder / "tokenizer.json").write_text(_dump(data), encoding="utf-8")
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (source / name).is_file():
            shutil.copyfile(source / name, folder / name)
    return {"method": f"the first {spec.params['keep_merges']} merges of {base} and the vocabulary they reach "
                      "(the 256 byte characters and every merge result, each token keeping its id; added tokens kept)",
            "source": {"family": base, "tokenizer_json_sha256": sha256_file(source / "tokenizer.json")},
            "parameters": dict(spec.params), "vocab_size": len(data["model"]["vocab"]),
            "merges": len(data["model"]["merges"])}


def build_lab_families(out_dir: str | Path, *, pool: str | Path, shared: str | Path = Path("../shared"),
                       names: Sequence[str] | None = None, mistral_data: str | Path | None = None,
                       mistral_wheel: str | Path | None = None,
                       train_bytes: int = TRAIN_BYTES) -> list[FamilySource]:
    """Write one tokenizer folder per family of `names` (default: all of `V3_FAMILY_NAMES`, in
    order) under `out_dir`; a pruned family's base is built first when it is not listed. The
    mistral vocabularies come from `mistral_data`, else the pinned wheel `mistral_wheel`
    (`mistral_data_from_wheel`), else the installed mistral-common."""
    if mistral_wheel is not None and mistral_data is None:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="lstar-mistral-") as tmp:
            return build_lab_families(out_dir, pool=pool, shared=shared, names=names,
                                      mistral_data=mistral_data_from_wheel(mistral_wheel, tmp), train_bytes=train_bytes)
    names = list(V3_FAMILY_NAMES if names is None else names)
    unknown = [n for n in names if n not in SPEC_BY_NAME]
    if unknown:
        raise LabError(f"unknown families {', '.join(unknown)}", hint=f"choose from {', '.join(V3_FAMILY_NAMES)}")
    needed = list(names)
    for n in names:
        base = SPEC_BY_NAME[n].params.get("base") if SPEC_BY_NAME[n].kind == "pruned" else None
        if base and base not in needed:
            needed.insert(needed.index(n), base)
    out, shared = Path(out_dir), Path(shared)
    texts = text_facts = data_dir = None
    built: dict[str, Path] = {}
    sources = []
    for name in needed:
        spec = SPEC_BY_NAME[name]
        folder = out / name
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        if spec.kind == "shared":
            prov = _build_shared(spec, folder, shared)
        elif spec.kind == "mistral":
            data_dir = data_dir or (Path(mistral_data) if mistral_data else mistral_data_dir())
            prov = _build_mistral(spec, folder, data_dir)
        elif spec.kind == "trained":
            if texts is None:
                texts, text_facts = training_texts(Path(pool), train_bytes)
            prov = _build_trained(spec, folder, texts, text_facts)
        else:
            prov = _build_pruned(spec, folder, built)
        prov = {"family": name, "kind": spec.kind, **prov, "built_with": _versions(),
                "tokenizer_json_sha256": sha256_file(folder / "tokenizer.json")}
        atomic_write_text(folder / "provenance.json", _pretty(prov))
        log.info("built %s (%s)", name, spec.kind)
        built[name] = folder
        if name in names:
            sources.append(FamilySource(name, spec.kind, folder, prov))
    return sources


# ------------------------------------------------------------------ the round trip
def _doc(document: Any) -> tuple[str, str]:
    if isinstance(document, tuple):
        return str(document[0]), document[1]
    return str(document.id), document.text


def special_literals(handle: Any) -> list[str]:
    """The special tokens a tokenizer matches in raw text (its added tokens marked special)."""
    tok = getattr(handle, "tokenizer", handle)
    return sorted({t.content for t in tok.get_added_tokens_decoder().values() if t.special and t.content})


def round_trip_exclusions(families: Mapping[str, Any], documents: Sequence[Any]) -> list[str]:
    """The ids of documents that hold a special-token literal of some family (e.g. a literal
    `<|im_start|>`) and fail the decode round trip under at least one family, in document order.
    They are excluded from the round-trip check for every family alike; a document that fails
    without such a literal is not excused (the family is lossy)."""
    from monitor.lab.pool import round_trip_failures

    literals = sorted({lit for handle in families.values() for lit in special_literals(handle)})
    excluded = []
    for doc_id, text in map(_doc, documents):
        if any(lit in text for lit in literals) and \
                any(round_trip_failures(handle, [text]) for handle in families.values()):
            excluded.append(doc_id)
    return excluded


def round_trip_checks(families: Mapping[str, Any], texts_by_name: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    """The round trip of every family on every named text (documents or (id, text) pairs), after
    `round_trip_exclusions` over all of them. Returns {"excluded", "checks": {family: check},
    "lossy": {family: reason}}; nothing is refused here."""
    from monitor.lab.pool import check_lossless, lossy_reason

    all_docs = [d for docs in texts_by_name.values() for d in docs]
    excluded = set(round_trip_exclusions(families, all_docs))
    kept = {name: [text for doc_id, text in map(_doc, docs) if doc_id not in excluded]
            for name, docs in texts_by_name.items()}
    checks = {family: check_lossless(handle, family, kept) for family, handle in families.items()}
    return {"excluded": sorted(excluded), "checks": checks,
            "lossy": {f: lossy_reason(f, c) for f, c in checks.items() if not c["lossless"]}}


def refuse_lossy(families: Mapping[str, Any], texts_by_name: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    """`round_trip_checks`, and a family for which any remaining document fails is refused in
    one line naming it and the share failing. Returns {"excluded", "checks"}."""
    result = round_trip_checks(families, texts_by_name)
    for family, reason in result["lossy"].items():
        raise LabError(reason, hint=f"drop {family} from the v3 families (documents excluded for all: "
                                    f"{', '.join(result['excluded']) or 'none'})")
    return {"excluded": result["excluded"], "checks": result["checks"]}


# ------------------------------------------------------------------ the whole check
# A family folder is hostile input: its files are checked from their metadata before the
# tokenizer library (which reads a file whole) sees them. The largest candidate's tokenizer.json
# is a few MB (gpt-4o 7.5 MB); the bound is the model gate's (`monitor.hub.gate`). Used by the
# check below and at the start of a run (`monitor.lab.family_set`).
FAMILY_FILE_MAX_BYTES = {"tokenizer.json": 64 << 20, "tokenizer_config.json": 1 << 20,
                         "special_tokens_map.json": 1 << 20}


def check_family_folder(folder: Path, name: str) -> None:
    """Refuse, in one line naming the file, a family folder whose tokenizer files are not
    regular files (a FIFO would block the reader, a device feed it for ever) or are larger than
    `FAMILY_FILE_MAX_BYTES`; tokenizer.json must exist."""
    import os
    import stat

    for file, limit in FAMILY_FILE_MAX_BYTES.items():
        path = folder / file
        try:
            info = os.stat(path)          # follows a link: its target is what would be read
        except FileNotFoundError:
            if file == "tokenizer.json":
                raise LabError(f"family {name!r}: {path} is missing",
                               hint="a family folder holds a tokenizer.json (lstar lab tokenizers build)") from None
            continue
        except OSError as exc:
            raise LabError(f"family {name!r}: {path} cannot be read: {exc.strerror or exc}",
                           hint="check the file and its permissions") from None
        if not stat.S_ISREG(info.st_mode):
            raise LabError(f"family {name!r}: {path} is not a regular file",
                           hint="a family folder holds plain JSON files; remove or replace it")
        if info.st_size > limit:
            raise LabError(f"family {name!r}: {path} is {info.st_size} bytes, larger than the {limit} read",
                           hint="is it a tokenizer file? rebuild the family (lstar lab tokenizers build)")


DEFAULT_CUTOFF = 0.96          # pre-registered in docs/lab.md, "Families v3"
LAB_TRAIN_CHUNKS = 200         # as lab v2's family_checks


def check_family_set(folder: str | Path, *, pool: str | Path, shared: str | Path = Path("../shared"),
                     names: Sequence[str] | None = None, cutoff: float = DEFAULT_CUTOFF,
                     reference: Sequence[str] = ("phi-3",)) -> dict[str, Any]:
    """The round trip (`refuse_lossy`) of the built families under `folder` on the lab's texts
    (the first 200 chunks of `pool`'s train split and v3's held-out text, `monitor.lab.heldout`)
    and calib-v0, then their boundary Jaccard matrix on calib-v0 and the greedy distinct set at
    `cutoff`. `reference`
    tokenizers of the shared folder join the matrix after the candidates (not the set)."""
    from monitor.lab.distinctness import distinct_families, jaccard_matrix
    from monitor.lab.heldout import stratified_heldout
    from monitor.lab.pool import chunk_texts, load_pool
    from monitor.scoring import load_corpus, load_tokenizer

    folder, shared = Path(folder), Path(shared)
    names = [n for n in (names or V3_FAMILY_NAMES) if (folder / n / "tokenizer.json").is_file()]
    if not names:
        raise LabError(f"{folder} holds none of the v3 families", hint="run `lstar lab tokenizers build` first")
    for n in names:      # a hostile folder is refused from its files' metadata, before they are read
        check_family_folder(folder / n, n)
    handles = {n: load_tokenizer(folder / n) for n in names}
    loaded = load_pool(pool)
    train = chunk_texts([d.text for d in loaded.train.documents], 600)   # the lab's 600-character chunks
    calib = load_corpus(shared / "corpus" / "calib-v0")
    lab_texts = {"train": [(f"train-{i}", t) for i, t in enumerate(train[:LAB_TRAIN_CHUNKS])],
                 "heldout": [(f"heldout-{i}", t) for i, t in enumerate(
                     stratified_heldout(loaded.train.documents, loaded.heldout.documents, 200_000).texts)],
                 "calib": calib.documents}
    round_trip = refuse_lossy(handles, lab_texts)
    # The matrix is measured on calib-v0 less the documents excluded from the round trip for
    # every family, as at the start of a run (`family_set.check_run_families`).
    excluded = set(round_trip["excluded"])
    docs = [d.text for d in calib.documents if str(d.id) not in excluded]
    refs = {r: load_tokenizer(shared / "tokenizers" / r) for r in reference if r not in handles}
    all_names, matrix = jaccard_matrix({**handles, **refs}, docs)
    distinct = distinct_families(names, cutoff=cutoff, matrix=matrix[:len(names), :len(names)])
    n_bytes = sum(len(t.encode("utf-8")) for t in docs)
    return {"calib_sha256": calib.sha256, "pool": loaded.provenance(), "cutoff": cutoff,
            "round_trip": {"excluded": round_trip["excluded"],
                           "documents": {k: len(v) for k, v in lab_texts.items()},
                           "failing": {n: sum(t["failing"] for t in c["texts"].values())
                                       for n, c in round_trip["checks"].items()}},
            "tokens_per_byte": {n: round(sum(len(s) for s in h.encode_documents(docs)) / n_bytes, 4)
                                for n, h in {**handles, **refs}.items()},
            "names": all_names, "matrix": matrix.round(4).tolist(),
            "kept": distinct["kept"], "dropped": distinct["dropped"]}
