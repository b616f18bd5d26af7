"""The vocabulary size a tiny checkpoint is built with (`monitor.lab.tiny_models.vocab_size`):
read once per tokenizer file and process, and the same as reading the file each time."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from monitor.lab import tiny_models
from monitor.lab.tiny_models import vocab_size


def fresh_count(folder: Path) -> int:
    """1 + the largest id of the tokenizer in `folder`, parsed here."""
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return 1 + max(tok.get_vocab(with_added_tokens=True).values())


@pytest.mark.parametrize("name", ["gpt-neox", "gpt-4o", "spm-unigram-toy"])
def test_the_cached_count_is_the_tokenizers_and_the_file_is_parsed_once(shared_dir, monkeypatch, name):
    folder = shared_dir / "tokenizers" / name
    expected = fresh_count(folder)
    assert vocab_size(folder) == expected
    # gpt-4o's o200k ids have gaps: the count is its largest id + 1, not its number of tokens
    if name == "gpt-4o":
        assert expected > len(Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab(with_added_tokens=True))

    def refuse(path: str) -> None:
        raise AssertionError(f"parsed {path} again")

    monkeypatch.setattr(Tokenizer, "from_file", refuse)
    assert vocab_size(folder) == expected
    assert vocab_size(str(folder)) == expected   # the same file however the folder is named


def test_a_changed_tokenizer_file_is_read_again(shared_dir, tmp_path):
    folder = tmp_path / "tok"
    shutil.copytree(shared_dir / "tokenizers" / "spm-unigram-toy", folder)
    before = vocab_size(folder)
    data = json.loads((folder / "tokenizer.json").read_text())
    data["added_tokens"].append({"id": before, "content": "<extra>", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": True})
    (folder / "tokenizer.json").write_text(json.dumps(data))
    assert vocab_size(folder) == fresh_count(folder) == before + 1
    assert tiny_models._vocab_size.cache_info().currsize >= 2


def test_a_rewrite_that_keeps_the_size_and_the_modification_time_is_read_again(shared_dir, tmp_path, monkeypatch):
    """A file rewritten in place with its modification time set back (as `copy2` or `os.utime`
    leave it) and the same size is parsed again: its change time moved."""
    folder = tmp_path / "tok"
    shutil.copytree(shared_dir / "tokenizers" / "spm-unigram-toy", folder)
    path = folder / "tokenizer.json"
    vocab_size(folder)
    before = path.stat()
    time.sleep(0.05)      # past the file system's clock tick, so the change time can move
    path.write_bytes(path.read_bytes())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    expected = fresh_count(folder)
    parsed = []
    real = Tokenizer.from_file

    def counting(name: str) -> Tokenizer:
        parsed.append(name)
        return real(name)

    monkeypatch.setattr(Tokenizer, "from_file", counting)
    assert vocab_size(folder) == expected
    assert parsed == [str(path.resolve())]
