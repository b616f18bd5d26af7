"""A tokenizer loaded again in the same process (`load_tokenizer` keeps what it derives from
tokenizer.json's text by that text's sha256) has the fingerprint and id space computed from the
file afresh, and an edited file is derived again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import monitor.scoring.tokenizer as tok


def _fresh(folder: Path, handle: tok.TokenizerHandle) -> tuple[str, int]:
    """The fingerprint and id space straight from the file, as the code computed them before."""
    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    return (tok.tokenizer_fingerprint(tok.canonical_tokenizer_json(data), handle.prefix_policy, handle.prefix_token_id),
            tok._id_space(data, handle.tokenizer))


def test_a_reload_and_an_edited_file_give_the_fresh_fingerprint(shared_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "gpt2"
    shutil.copytree(shared_dir / "tokenizers" / "gpt2", folder)
    first, again = tok.load_tokenizer(folder), tok.load_tokenizer(folder)
    assert (first.fingerprint, first.vocab_size) == (again.fingerprint, again.vocab_size) == _fresh(folder, first)
    # another prefix policy over the same tokenizer.json: its own fingerprint, not the first one's
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}), encoding="utf-8")
    (folder / "special_tokens_map.json").unlink()
    other_policy = tok.load_tokenizer(folder)
    assert first.prefix_policy == "bos" and other_policy.prefix_policy == "eos" and other_policy.fingerprint != first.fingerprint
    assert other_policy.fingerprint == _fresh(folder, other_policy)[0]
    # an added token: another text, derived again (another fingerprint and id space)
    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    data["added_tokens"].append({"id": 50257, "content": "<|extra|>", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": True})
    (folder / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    edited = tok.load_tokenizer(folder)
    assert (edited.fingerprint, edited.vocab_size) == _fresh(folder, edited)
    assert edited.vocab_size == first.vocab_size + 1 and edited.fingerprint != other_policy.fingerprint
