"""Bounded reads name the kind of file the caller expected: a policy file, a curve artifact,
a watch-rules file, a lab record, each in its own words."""

from __future__ import annotations

import os

import pytest

from monitor.curves import load_curve
from monitor.curves.artifact import CURVE_MAX_BYTES
from monitor.errors import CurveError, PolicyError
from monitor.files import POLICY_MAX_BYTES, FileKind, read_bounded_bytes, read_bounded_text
from monitor.hub.rules import load_watch_rules


def test_the_default_kind_is_a_policy_file(tmp_path):
    with pytest.raises(PolicyError) as err:
        read_bounded_bytes(tmp_path, str(tmp_path))
    assert err.value.message == f"{tmp_path}: is a directory, not a policy file"
    assert err.value.hint == "policy files are regular YAML files; rename or remove it"


def test_the_caller_names_the_kind(tmp_path):
    fifo = tmp_path / "notes.fifo"
    os.mkfifo(fifo)
    kind = FileKind("notes file", "notes files", "Markdown")
    with pytest.raises(PolicyError) as err:
        read_bounded_text(fifo, "notes", what=kind)
    assert err.value.message == "notes: is a named pipe (FIFO), not a notes file"
    assert err.value.hint == "notes files are regular Markdown files; rename or remove it"
    big = tmp_path / "big.md"
    big.write_bytes(b"x" * 11)
    with pytest.raises(PolicyError) as err:
        read_bounded_bytes(big, "big", what=kind, limit=10)
    assert err.value.message == "big: file is 11 bytes; notes files are limited to 10 bytes"
    small = tmp_path / "small.md"
    small.write_bytes(b"x" * POLICY_MAX_BYTES)
    assert read_bounded_text(small, "small", what=kind) == "x" * POLICY_MAX_BYTES


def test_a_curve_path_that_is_a_directory_is_named_a_curve_artifact(tmp_path):
    folder = tmp_path / "curve.json"
    folder.mkdir()
    with pytest.raises(CurveError) as err:
        load_curve(folder)
    assert err.value.message == f"{folder}: is a directory, not a curve artifact"


def test_an_oversized_curve_names_the_curve_limit(tmp_path):
    path = tmp_path / "curve.json"
    with path.open("wb") as f:
        f.truncate(CURVE_MAX_BYTES + 1)
    with pytest.raises(CurveError) as err:
        load_curve(path)
    assert err.value.message == (f"{path}: file is {CURVE_MAX_BYTES + 1:,} bytes; curve artifacts are "
                                 f"limited to {CURVE_MAX_BYTES:,} bytes")


def test_a_watch_rules_path_that_is_a_fifo_is_named_a_watch_rules_file(tmp_path):
    fifo = tmp_path / "rules.yaml"
    os.mkfifo(fifo)
    with pytest.raises(PolicyError) as err:
        load_watch_rules(fifo)
    assert err.value.message == f"not valid YAML: {fifo}: is a named pipe (FIFO), not a watch-rules file"
    assert err.value.hint == "watch-rules files are regular YAML files; rename or remove it"
