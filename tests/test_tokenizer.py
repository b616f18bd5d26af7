"""Real tokenizers from ../shared/tokenizers: prefix policy, fingerprints, pinned token ids of
calib-v0, unigram baselines against shared/README.md, and the baseline cache in DuckDB."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from lanes import fast_first

from monitor.errors import TokenizerError
from monitor.scoring.corpus import Corpus, load_corpus
from monitor.scoring.metrics import compute_baseline, get_or_compute_baseline
from monitor.scoring.tokenizer import TokenizerHandle, load_tokenizer
from monitor.store import Store

# From the special-token table of shared/README.md: BOS if defined, else EOS, else none.
EXPECTED_PREFIX = {
    "gpt2": ("bos", "<|endoftext|>"), "gpt-neox": ("bos", "<|endoftext|>"),
    "llama-2": ("bos", "<s>"), "llama-3": ("bos", "<|begin_of_text|>"),
    "qwen2": ("eos", "<|endoftext|>"), "phi-3": ("bos", "<s>"),
    "bert-base-uncased": ("none", None), "gpt-4o": ("eos", "<|endoftext|>"),
    "smollm2": ("bos", "<|im_start|>"), "starcoder2": ("bos", "<|endoftext|>"),
    "xlm-roberta": ("bos", "<s>"), "spm-unigram-toy": ("bos", "<s>"),
}
# From the token-count table of shared/README.md: model_max_length, H1 nats/token, and
# tokens/byte of the code and prose slices.
README_TABLE = {
    "gpt2": (1024, 6.3867, 0.433, 0.275),
    "gpt-neox": (2048, 6.8615, 0.296, 0.277),
    "llama-3": (8192, 7.2180, 0.261, 0.257),
    "qwen2": (32768, 7.0712, 0.264, 0.257),
    "smollm2": (8192, 6.7002, 0.283, 0.278),
    "bert-base-uncased": (512, 6.2588, 0.284, 0.246),
}
CORE = list(README_TABLE)


@pytest.fixture(scope="module")
def tokenizers_dir(shared_dir: Path) -> Path:
    return shared_dir / "tokenizers"


class _LoadedOnFirstUse(Mapping):
    """A mapping whose values are made on first access: a fast-lane run that checks a few
    tokenizers loads (and encodes with) only those; iterating the mapping makes them all."""

    def __init__(self, names: list[str], make: Callable[[str], Any]) -> None:
        self._names, self._make, self._made = list(names), make, {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._names:
            raise KeyError(name)
        if name not in self._made:
            self._made[name] = self._make(name)
        return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


@pytest.fixture(scope="module")
def handles(tokenizers_dir: Path) -> Mapping[str, TokenizerHandle]:
    return _LoadedOnFirstUse(list(EXPECTED_PREFIX), lambda name: load_tokenizer(tokenizers_dir / name))


@pytest.fixture(scope="module")
def calib(calib_v0: Path) -> Corpus:
    return load_corpus(calib_v0)


@pytest.fixture(scope="module")
def encoded(handles, calib) -> Mapping[str, list[list[int]]]:
    return _LoadedOnFirstUse(CORE, lambda name: handles[name].encode_documents(calib))


def token_id(tokenizers_dir: Path, name: str, content: str) -> int:
    """The id of an added token, read straight from tokenizer.json."""
    data = json.loads((tokenizers_dir / name / "tokenizer.json").read_text(encoding="utf-8"))
    ids = [t["id"] for t in data["added_tokens"] if t["content"] == content]
    if not ids:
        ids = [data["model"]["vocab"][content]]
    return ids[0]


# The fast lane checks one tokenizer of each policy (bos, eos, none); the full run all twelve.
PREFIX_FAST_FIRST = ["gpt2", "qwen2", "bert-base-uncased"]


@pytest.mark.parametrize("name", fast_first(
    PREFIX_FAST_FIRST + sorted(set(EXPECTED_PREFIX) - set(PREFIX_FAST_FIRST)), keep=len(PREFIX_FAST_FIRST)))
def test_prefix_policy_follows_the_spec(name, handles, tokenizers_dir) -> None:
    policy, token = EXPECTED_PREFIX[name]
    handle = handles[name]
    assert handle.prefix_policy == policy
    expected_id = None if token is None else token_id(tokenizers_dir, name, token)
    assert handle.prefix_token_id == expected_id
    assert handle.as_row() == {"fingerprint": handle.fingerprint, "source": str(tokenizers_dir / name),
                               "vocab_size": handle.vocab_size, "prefix_policy": policy,
                               "prefix_token_id": expected_id}


def test_fingerprint_is_sha256_of_canonical_json_and_prefix(handles, tokenizers_dir) -> None:
    for name in ("gpt2", "qwen2", "bert-base-uncased"):
        data = json.loads((tokenizers_dir / name / "tokenizer.json").read_text(encoding="utf-8"))
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        handle = handles[name]
        suffix = f"{handle.prefix_policy}:{'' if handle.prefix_token_id is None else handle.prefix_token_id}"
        assert handle.fingerprint == hashlib.sha256((canonical + "\n" + suffix).encode()).hexdigest()


@pytest.mark.slow  # loads all twelve tokenizers
def test_fingerprints_are_stable_and_distinct(handles, tokenizers_dir, tmp_path) -> None:
    fingerprints = {name: h.fingerprint for name, h in handles.items()}
    assert len(set(fingerprints.values())) == len(fingerprints)
    for name in ("gpt2", "smollm2"):
        assert load_tokenizer(tokenizers_dir / name / "tokenizer.json").fingerprint == fingerprints[name]
        # Re-serialised with indentation and reversed key order: same content, same fingerprint.
        copy = tmp_path / name
        shutil.copytree(tokenizers_dir / name, copy)
        data = json.loads((copy / "tokenizer.json").read_text(encoding="utf-8"))
        reordered = dict(reversed(list(data.items())))
        (copy / "tokenizer.json").write_text(json.dumps(reordered, indent=3), encoding="utf-8")
        original = (tokenizers_dir / name / "tokenizer.json").read_bytes()
        assert (copy / "tokenizer.json").read_bytes() != original
        assert load_tokenizer(copy).fingerprint == fingerprints[name]


def test_fingerprint_includes_the_prefix_policy(handles, tokenizers_dir, tmp_path) -> None:
    # gpt2 with its BOS removed falls back to EOS: the same id (50256), a different policy.
    copy = tmp_path / "gpt2-eos"
    shutil.copytree(tokenizers_dir / "gpt2", copy)
    for file in ("tokenizer_config.json", "special_tokens_map.json"):
        data = json.loads((copy / file).read_text(encoding="utf-8"))
        del data["bos_token"]
        (copy / file).write_text(json.dumps(data), encoding="utf-8")
    handle = load_tokenizer(copy)
    original = handles["gpt2"]                   # load_tokenizer(tokenizers_dir / "gpt2"), made once per module
    assert (handle.prefix_policy, handle.prefix_token_id) == ("eos", 50256)
    assert handle.fingerprint != original.fingerprint


def test_special_tokens_map_overrides_the_config(tokenizers_dir, tmp_path) -> None:
    # bert-base-uncased defines neither BOS nor EOS; a map that names [CLS] as BOS wins,
    # written as an AddedToken object as transformers saves it.
    copy = tmp_path / "bert-with-bos"
    shutil.copytree(tokenizers_dir / "bert-base-uncased", copy)
    token_map = json.loads((copy / "special_tokens_map.json").read_text(encoding="utf-8"))
    token_map["bos_token"] = {"content": "[CLS]", "lstrip": False, "special": True}
    (copy / "special_tokens_map.json").write_text(json.dumps(token_map), encoding="utf-8")
    handle = load_tokenizer(copy)
    assert (handle.prefix_policy, handle.prefix_token_id) == ("bos", 101)
    assert handle.bos_token == "[CLS]" and handle.eos_token is None


@pytest.mark.parametrize("name", fast_first(CORE, keep=2))
def test_calib_v0_token_ids_match_the_pins(name, encoded, shared_dir, handles) -> None:
    pins = json.loads((shared_dir / "tokenizers" / "calib-v0-fingerprints.json").read_text())
    seqs = encoded[name]
    assert sum(map(len, seqs)) == pins[name]["tokens"]
    # As check_tokenizers.py computes it: one line per document, ids joined by spaces.
    text = "\n".join(" ".join(str(i) for i in seq) for seq in seqs)
    assert hashlib.sha256(text.encode()).hexdigest() == pins[name]["ids_sha256"]
    assert handles[name].model_max_length == README_TABLE[name][0]


@pytest.mark.parametrize("name", fast_first(CORE, keep=2))
def test_unigram_baseline_matches_the_readme_table(name, encoded, handles, calib) -> None:
    _, h1, code_tpb, prose_tpb = README_TABLE[name]
    handle, seqs = handles[name], encoded[name]
    base = compute_baseline(handle, calib, seqs)
    slice_bytes = {s: sum(d.n_bytes for d in calib.documents if d.slice == s) for s in calib.slices}
    if handle.prefix_policy != "none":
        # Every token is scored: the README's H1 is CE_uni.
        assert base["n_tokens"] == sum(map(len, seqs))
        assert round(base["ce_unigram"], 4) == h1
        assert round(base["slices"]["code"]["n_tokens"] / slice_bytes["code"], 3) == code_tpb
        assert round(base["slices"]["prose"]["n_tokens"] / slice_bytes["prose"], 3) == prose_tpb
    else:
        # No prefix token: the first token of each document is not scored (216 fewer),
        # so CE_uni differs from H1. Check it against a naive count.
        counts = Counter(t for seq in seqs for t in seq[1:])
        n = sum(counts.values())
        naive = -sum(c / n * math.log(c / n) for c in counts.values())
        assert base["n_tokens"] == n == sum(map(len, seqs)) - 216
        assert base["ce_unigram"] == pytest.approx(naive, rel=1e-12)
        assert round(base["ce_unigram"], 4) != h1 and abs(base["ce_unigram"] - h1) < 0.01
    assert sum(base["doc_tokens"].values()) == base["n_tokens"]
    assert sum(s["n_tokens"] for s in base["slices"].values()) == base["n_tokens"]


def test_baselines_are_cached_and_reused_in_duckdb(handles, encoded, calib, tmp_path) -> None:
    db = tmp_path / "x.duckdb"
    gpt2, seqs = handles["gpt2"], encoded["gpt2"]
    with Store.open(db) as store:
        first = get_or_compute_baseline(store, gpt2, calib, seqs)
        assert first == compute_baseline(gpt2, calib, seqs)
        row = store.query("SELECT computed_at FROM baselines")
        assert len(row) == 1
        # Deliberately wrong token ids: a reused baseline ignores them.
        again = get_or_compute_baseline(store, gpt2, calib, [[0]] * len(calib.documents))
        assert again == first
        assert store.query("SELECT computed_at FROM baselines") == row
    with Store.open(db) as store:                                   # survives reopening
        assert get_or_compute_baseline(store, gpt2, calib, None) == first
        # Another selection and another tokenizer are other keys.
        part = calib.select(first=10)
        small = get_or_compute_baseline(store, gpt2, part, seqs[:10])
        assert small["n_tokens"] == sum(map(len, seqs[:10]))
        bert = get_or_compute_baseline(store, handles["bert-base-uncased"], calib,
                                       encoded["bert-base-uncased"])
        assert bert["n_tokens"] == sum(map(len, encoded["bert-base-uncased"])) - 216
        keys = store.query("SELECT tokenizer_fingerprint, corpus_sha256 FROM baselines")
    assert {(k["tokenizer_fingerprint"], k["corpus_sha256"]) for k in keys} == {
        (gpt2.fingerprint, calib.sha256), (gpt2.fingerprint, part.sha256),
        (handles["bert-base-uncased"].fingerprint, calib.sha256)}


def test_missing_or_broken_tokenizers_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"tokenizer .*nowhere does not exist"):
        load_tokenizer(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TokenizerError, match=r"empty/tokenizer.json is missing"):
        load_tokenizer(empty)
    (empty / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nope"}}')
    with pytest.raises(TokenizerError, match=r"empty/tokenizer.json cannot be loaded by tokenizers"):
        load_tokenizer(empty)
    (empty / "tokenizer.json").write_text('{"version": ')
    with pytest.raises(TokenizerError, match=r"empty/tokenizer.json is not valid JSON"):
        load_tokenizer(empty)


@pytest.mark.slow  # gpt-4o and xlm-roberta are the slowest tokenizers to load
def test_vocab_size_covers_every_id(handles) -> None:
    # README: gpt-4o has 200,000 tokens with ids 0-200018 (gaps), so 200,019 ids are needed.
    assert handles["gpt-4o"].vocab_size == 200_019
    assert handles["gpt2"].vocab_size == 50_257
    assert handles["xlm-roberta"].vocab_size == 250_002
    for name in ("gpt-4o", "spm-unigram-toy"):
        vocab = handles[name].tokenizer.get_vocab(with_added_tokens=True)
        assert handles[name].vocab_size == max(vocab.values()) + 1


def test_the_default_shared_paths_are_the_folder_beside_the_checkout(shared_dir):
    """Modules that find ../shared by their own location name the same folder as the tests do
    (a file moved one package down once looked for it inside the checkout, which only a
    machine without the cached SmolLM2 copy noticed)."""
    from monitor.demo.hub_repos import SHARED_TOKENIZERS
    from monitor.scoring.smollm2 import default_tokenizer_dir

    assert default_tokenizer_dir().resolve() == shared_dir / "tokenizers" / "smollm2"
    assert (default_tokenizer_dir() / "tokenizer.json").is_file()
    assert SHARED_TOKENIZERS.resolve() == shared_dir / "tokenizers"


def _tokenizer_json(normalizer: object) -> str:
    """A minimal WordLevel tokenizer.json with the given normalizer."""
    return json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
                       "normalizer": normalizer, "pre_tokenizer": None, "post_processor": None, "decoder": None,
                       "model": {"type": "WordLevel", "vocab": {"a": 0, "[UNK]": 1}, "unk_token": "[UNK]"}})


def _sequence(depth: int) -> dict:
    node: dict = {"type": "Lowercase"}
    for _ in range(depth):
        node = {"type": "Sequence", "normalizers": [node]}
    return node


def test_load_failures_are_named_by_their_cause(tmp_path: Path) -> None:
    """Too deeply nested (Python's RecursionError, or the library's own recursion limit) and
    malformed files are told to restore the file; only a format version or a component type the
    installed tokenizers does not know is told it may need a newer release."""
    folder = tmp_path / "tok"
    folder.mkdir()
    file = folder / "tokenizer.json"
    file.write_text(_tokenizer_json(_sequence(3)))
    assert load_tokenizer(folder).vocab_size == 2                      # the same shape, shallow, loads

    def failure() -> str:
        with pytest.raises(TokenizerError) as info:
            load_tokenizer(folder)
        line = info.value.one_line()
        assert "\n" not in line and str(file) in line
        return line

    # Deeper than Python's recursion limit: json.loads raises RecursionError.
    file.write_text(_tokenizer_json(None).replace('"normalizer": null', '"normalizer": ' + "[" * 20_000 + "]" * 20_000))
    with pytest.raises(RecursionError):
        json.loads(file.read_text())
    line = failure()
    assert "nested too deeply" in line and "restore it" in line and "newer tokenizers" not in line
    # A valid shape nested past the library's own limit (128 levels).
    file.write_text(_tokenizer_json(_sequence(200)))
    line = failure()
    assert "nested too deeply" in line and "recursion limit" in line and "newer tokenizers" not in line
    # Malformed: a required field missing, a value of the wrong type.
    for broken in ('{"type": "WordLevel", "vocab": {"a": 0}}', '{"type": "WordLevel", "vocab": [1, 2], "unk_token": "a"}'):
        file.write_text(_tokenizer_json(None).replace(
            '{"type": "WordLevel", "vocab": {"a": 0, "[UNK]": 1}, "unk_token": "[UNK]"}', broken))
        line = failure()
        assert "cannot be loaded by tokenizers" in line and "restore it" in line and "newer tokenizers" not in line
    # Genuinely newer: an unknown format version, an unknown model type.
    for newer in (_tokenizer_json(None).replace('"version": "1.0"', '"version": "9.0"'),
                  _tokenizer_json(None).replace('"type": "WordLevel"', '"type": "WordLevelV9"')):
        file.write_text(newer)
        line = failure()
        assert "may need a newer tokenizers release" in line
    # A special-tokens file nested too deeply is named as such too.
    file.write_text(_tokenizer_json(None))
    (folder / "tokenizer_config.json").write_text("[" * 20_000 + "]" * 20_000)
    with pytest.raises(TokenizerError, match="tokenizer_config.json is nested too deeply"):
        load_tokenizer(folder)
