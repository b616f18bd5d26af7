"""The report's JSON text (`monitor.reports.json_text`): what it decodes to is what the json
module's own encoding decodes to, for every kind of value a report holds, and its layout puts
each table row on one line."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone

from monitor.reports.json_text import iter_json, json_default, to_json

MOMENT = datetime(2026, 11, 29, 7, 0, tzinfo=timezone(timedelta(hours=2)))


def reference(value):
    """The json module's indenting encoder, decoded (NaN compared as text)."""
    return json.loads(json.dumps(value, indent=2, sort_keys=True, default=json_default))


def test_every_kind_of_value_decodes_as_the_json_module_encodes_it() -> None:
    value = {
        "zeta": [1, 2.5, -0.0, 1e300, None, True, False, "é ✓ \" \n \\", (3, 4)],
        "alpha": {"empty_list": [], "empty_dict": {}, "nested": {"b": 1, "a": [{"k": 1}]}},
        "rows": [{"b": 2, "a": MOMENT, "refs": ["main", "step10"], "stability": {"n": 3, "mean": 0.25}},
                 {"a": None, "b": 1e-7, "refs": [], "stability": None}],
        "sections": [{"name": "t", "lineages": [{"lineage": "org/m", "lstar": 2.0}]}],
        "numbers": {2: "two", 1: "one"},   # json's own key conversion (to text)
        "_private": "left out",
    }
    text = to_json(value)
    expected = reference({k: v for k, v in value.items() if k != "_private"})
    assert json.loads(text) == expected
    assert "_private" not in text and text.isascii() and text.endswith("\n")
    assert json.loads(text)["rows"][0]["a"] == "2026-11-29T05:00:00+00:00"   # ISO 8601, in UTC


def test_non_finite_numbers_are_spelled_as_the_json_module_spells_them() -> None:
    text = to_json({"rows": [{"x": math.nan, "y": math.inf, "z": -math.inf}], "v": math.nan})
    assert '{"x": NaN, "y": Infinity, "z": -Infinity}' in text and '"v": NaN' in text


def test_rows_are_one_line_and_sections_indented() -> None:
    value = {"history": [{"b": 1, "a": {"c": [1, 2]}}, {"a": 2}],
             "tasks": [{"task": "arc", "lineages": [{"lineage": "m", "x": 1}]}], "period": {"start": 1}}
    assert to_json(value) == (
        '{\n'
        '  "history": [\n'
        '    {"a": {"c": [1, 2]}, "b": 1},\n'
        '    {"a": 2}\n'
        '  ],\n'
        '  "period": {\n'
        '    "start": 1\n'
        '  },\n'
        '  "tasks": [\n'
        '    {\n'
        '      "lineages": [\n'
        '        {"lineage": "m", "x": 1}\n'
        '      ],\n'
        '      "task": "arc"\n'
        '    }\n'
        '  ]\n'
        '}\n')


def test_a_long_report_comes_in_pieces_of_about_64k_characters() -> None:
    rows = [{"i": i, "name": f"org/model-{i}", "lstar": i / 7} for i in range(20000)]
    chunks = list(iter_json({"lineage_history": rows}))
    assert len(chunks) > 5 and all(65536 <= len(c) < 65536 + 200 for c in chunks[:-1])
    assert json.loads("".join(chunks))["lineage_history"] == rows


def test_an_unknown_type_is_refused_naming_it() -> None:
    try:
        to_json({"rows": [{"x": object()}]})
    except TypeError as exc:
        assert "cannot encode object" in str(exc)
    else:
        raise AssertionError("an object() was encoded")
