"""Tokenizers: load a tokenizer folder, decide its prefix token, fingerprint it, encode a corpus.

The fast `tokenizers.Tokenizer` is loaded straight from `tokenizer.json`; on the shared
tokenizers it gives exactly the ids of `transformers.AutoTokenizer` (both match special-token
strings that occur in raw text, even with `add_special_tokens=False`). The special tokens come
from `tokenizer_config.json` and `special_tokens_map.json`, read as transformers 5 reads them.

Prefix policy of scoring spec `lstar-score/1`: each document is scored after one prefix
token, BOS if the tokenizer defines one, else EOS; with neither ("none") the first token of
each document is not scored.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import Tokenizer

from monitor.errors import TokenizerError

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
PREFIX_POLICIES = ("bos", "eos", "none")

# transformers writes int(1e30) as model_max_length when a tokenizer has no limit.
_UNBOUNDED_MAX_LENGTH = 10**12
# What the tokenizers library says when a file names a format version or a component type it
# does not know: the only failures a newer release can cure.
_VERSION_MARKERS = ("unknown tokenizer version", "unknown variant", "did not match any variant")
# What it says when the file nests deeper than its JSON reader allows (128 levels).
_DEPTH_MARKERS = ("recursion limit exceeded",)


@dataclass
class TokenizerHandle:
    """A loaded tokenizer with the facts scoring needs about it."""

    tokenizer: Tokenizer
    source: str                  # the folder it was loaded from
    vocab_size: int              # 1 + largest token id (ids may have gaps, e.g. o200k)
    prefix_policy: str           # "bos" | "eos" | "none"
    prefix_token_id: int | None
    fingerprint: str             # sha256(canonical tokenizer.json + "\n" + policy + ":" + id)
    model_max_length: int | None
    bos_token: str | None = None
    eos_token: str | None = None

    def encode_documents(self, corpus: Any) -> list[list[int]]:
        """Token ids of each document (a `Corpus`, or a sequence of texts), in order.

        As the spec says: `add_special_tokens=False`, no truncation, no padding; special-token
        strings that occur in the text are matched as the Hugging Face tokenizer does.
        """
        texts = [d.text for d in corpus.documents] if hasattr(corpus, "documents") else list(corpus)
        return [enc.ids for enc in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def as_row(self) -> dict[str, Any]:
        """The row `Store.upsert_tokenizer` expects."""
        return {"fingerprint": self.fingerprint, "source": self.source,
                "vocab_size": self.vocab_size, "prefix_policy": self.prefix_policy,
                "prefix_token_id": self.prefix_token_id}


def canonical_tokenizer_json(data: Any) -> str:
    """tokenizer.json content in canonical form (sorted keys, no whitespace, UTF-8 kept)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def tokenizer_fingerprint(canonical_json: str, prefix_policy: str, prefix_token_id: int | None) -> str:
    """sha256 of `canonical_json + "\\n" + policy + ":" + id` (id empty for policy "none")."""
    suffix = f"\n{prefix_policy}:{'' if prefix_token_id is None else prefix_token_id}"
    return hashlib.sha256((canonical_json + suffix).encode("utf-8")).hexdigest()


def _fingerprint_from(canonical_sha256: Any, prefix_policy: str, prefix_token_id: int | None) -> str:
    """`tokenizer_fingerprint`, from a sha256 object already fed the canonical JSON."""
    suffix = f"\n{prefix_policy}:{'' if prefix_token_id is None else prefix_token_id}"
    digest = canonical_sha256.copy()
    digest.update(suffix.encode("utf-8"))
    return digest.hexdigest()


# What a load derives from tokenizer.json's text alone, by the sha256 of that text: the sha256
# object fed its canonical JSON, and its id space. A process that loads the same tokenizer again
# outside a warm worker's PrepareCache (the lab: a family's tokenizer in its round trip, family
# set and lineages; the stress tests; a test checking the engine against its own loop) skips
# parsing the JSON in Python and encoding it canonically: for Gemma 3's 262,144-token vocabulary
# a second load went from 3.4 to 1.7 CPU-seconds, for gpt2 from 0.28 to 0.11. The text itself is
# still parsed by the tokenizers library each time.
_DERIVED_MAX = 8
_derived: dict[str, tuple[Any, int]] = {}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise load_failure(path, exc) from exc


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else type(exc).__name__


def load_failure(file: Path, exc: BaseException) -> TokenizerError:
    """The one-line error for a tokenizer file that could not be read or loaded, by its cause.

    Nested too deeply (Python's RecursionError, or the library's own recursion limit), not JSON,
    unreadable, or malformed: the file must be restored. Only a format version or a component
    type the installed tokenizers does not know gets the hint to upgrade it.
    """
    text = _first_line(exc)
    restore = "the file is malformed or corrupt: restore it from the tokenizer's source"
    if isinstance(exc, RecursionError) or any(m in text.lower() for m in _DEPTH_MARKERS):
        return TokenizerError(f"{file} is nested too deeply to load ({text})", hint=restore)
    if isinstance(exc, (UnicodeDecodeError, json.JSONDecodeError)):
        return TokenizerError(f"{file} is not valid JSON ({text})", hint=restore)
    if isinstance(exc, OSError):
        return TokenizerError(f"{file} cannot be read ({text})", hint="check the file and its permissions")
    if any(m in text.lower() for m in _VERSION_MARKERS):
        return TokenizerError(f"{file} cannot be loaded by tokenizers {tokenizers.__version__}: {text}",
                              hint="it may need a newer tokenizers release")
    return TokenizerError(f"{file} cannot be loaded by tokenizers: {text}", hint=restore)


def _token_content(value: Any) -> str | None:
    """A special token as written in the config: a string, or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def special_tokens(folder: Path) -> dict[str, Any]:
    """The special tokens and settings of a tokenizer folder, merged as transformers 5 does.

    `tokenizer_config.json` is read first; `special_tokens_map.json` overrides it, except
    when the config carries `added_tokens_decoder` (then transformers ignores the map).
    """
    config_path, map_path = folder / CONFIG_FILE, folder / SPECIAL_TOKENS_FILE
    config = _read_json(config_path) if config_path.is_file() else {}
    if not isinstance(config, dict):
        raise TokenizerError(f"{config_path}: expected a JSON object")
    merged = dict(config)
    if map_path.is_file() and "added_tokens_decoder" not in config:
        token_map = _read_json(map_path)
        if not isinstance(token_map, dict):
            raise TokenizerError(f"{map_path}: expected a JSON object")
        merged.update(token_map)
    return merged


def _resolve_paths(path: str | Path) -> tuple[Path, Path]:
    """(folder, tokenizer.json) for a folder or a tokenizer.json path."""
    path = Path(path)
    if path.is_dir():
        folder, file = path, path / TOKENIZER_FILE
    elif path.is_file():
        folder, file = path.parent, path
    else:
        raise TokenizerError(f"tokenizer {path} does not exist",
                             hint="pass a folder holding tokenizer.json (or the file itself)")
    if not file.is_file():
        raise TokenizerError(f"{file} is missing",
                             hint="only fast tokenizers (tokenizer.json) are supported")
    return folder, file


def load_tokenizer(path: str | Path) -> TokenizerHandle:
    """Load a tokenizer folder (or its tokenizer.json) and decide its prefix policy."""
    folder, file = _resolve_paths(path)
    try:
        # One read feeds both the tokenizer and the fingerprint, so they describe the same bytes.
        raw = file.read_text(encoding="utf-8")
        raw_sha256 = hashlib.sha256(raw.encode("utf-8")).hexdigest()
        derived = _derived.get(raw_sha256)
        data = json.loads(raw) if derived is None else None
        tokenizer = Tokenizer.from_str(raw)
    except Exception as exc:  # the Rust side raises a plain Exception; load_failure sorts them
        raise load_failure(file, exc) from exc
    if derived is None:
        derived = (hashlib.sha256(canonical_tokenizer_json(data).encode("utf-8")), _id_space(data, tokenizer))
        if len(_derived) >= _DERIVED_MAX:
            _derived.pop(next(iter(_derived)))
        _derived[raw_sha256] = derived
    canonical_sha256, vocab_size = derived
    # The spec scores whole documents: no truncation or padding, whatever the file says.
    tokenizer.no_truncation()
    tokenizer.no_padding()

    settings = special_tokens(folder)
    bos, eos = _token_content(settings.get("bos_token")), _token_content(settings.get("eos_token"))
    policy, token = ("bos", bos) if bos else ("eos", eos) if eos else ("none", None)
    prefix_id = None
    if token is not None:
        prefix_id = tokenizer.token_to_id(token)
        if prefix_id is None:
            raise TokenizerError(f"{folder}: the {policy} token {token!r} is not in {file.name}",
                                 hint="fix the special tokens in tokenizer_config.json")
    max_length = settings.get("model_max_length")
    if not isinstance(max_length, int) or isinstance(max_length, bool) \
            or not 0 < max_length < _UNBOUNDED_MAX_LENGTH:
        max_length = None
    return TokenizerHandle(
        tokenizer=tokenizer, source=str(folder.resolve()),
        vocab_size=vocab_size,
        prefix_policy=policy, prefix_token_id=prefix_id,
        fingerprint=_fingerprint_from(canonical_sha256, policy, prefix_id),
        model_max_length=max_length, bos_token=bos, eos_token=eos)


def _id_space(data: Any, tokenizer: Tokenizer) -> int:
    """1 + the largest token id, read from the JSON (much cheaper than `get_vocab()`)."""
    vocab = data.get("model", {}).get("vocab") if isinstance(data, dict) else None
    ids = [t["id"] for t in data.get("added_tokens") or [] if isinstance(t, dict) and "id" in t]
    if isinstance(vocab, dict) and all(isinstance(i, int) for i in vocab.values()):
        ids.append(max(vocab.values(), default=-1))
    elif isinstance(vocab, list):                      # Unigram: ids are list positions
        ids.append(len(vocab) - 1)
    else:                                              # an unusual model: ask the library
        ids.extend(tokenizer.get_vocab(with_added_tokens=True).values())
    return max(ids, default=-1) + 1


def ids_sha256(token_seqs: Sequence[Sequence[int]]) -> str:
    """sha256 of the ids, one document per line, ids space-separated (as calib-v0-fingerprints.json)."""
    text = "\n".join(" ".join(map(str, seq)) for seq in token_seqs)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
