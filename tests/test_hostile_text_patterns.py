"""Patterns applied to hostile text (curve files, policy matchers and silences, watch-rule
globs and their matching) take time linear in it: a megabyte-long adversarial line is read in well under a second
or two, and the answers are those of the former (quadratic) patterns, computed here apart.
The .deb text patterns are checked in tests/test_pool.py."""

from __future__ import annotations

import random
import re
import time
from types import SimpleNamespace

import pytest

MB = 1 << 20


def timed(call, *args):
    start = time.perf_counter()
    result = call(*args)
    return result, time.perf_counter() - start


def test_a_stored_resolution_warning_is_read_in_linear_time() -> None:
    from monitor.curves.artifact import _resolution_again, resolution_warnings

    curve = SimpleNamespace(baseline=0.25)
    stored = resolution_warnings([40], baseline=0.25, margin=0.01, metric="acc,none")
    assert len(stored) == 2
    # at ε = 0.05: 1/40 = 0.025 resolves it, sqrt(0.25 * 0.75 / 40) = 0.068 does not
    assert _resolution_again(curve, stored[0], 0.05) == []
    assert _resolution_again(curve, stored[1], 0.05) == [
        "acc,none: binomial standard error at the baseline sqrt(b(1-b)/n) = 0.06847 (n = 40) exceeds the "
        "margin ε = 0.05; single checkpoints cannot resolve the threshold"]
    # the last '(n = N)' counts, as the greedy pattern took it
    assert _resolution_again(curve, "m: resolution 1/n (n = 3) then (n = 1000) x", 0.5) == []
    assert _resolution_again(curve, "no colon (n = 3)", 0.5) == ["no colon (n = 3)"]
    hostile = ": " * (MB // 2)
    result, seconds = timed(_resolution_again, curve, hostile, 0.05)
    assert result == [hostile] and seconds < 2.0   # quadratic: minutes


def test_a_matcher_is_parsed_in_linear_time() -> None:
    from monitor.policy.matchers import parse_matcher

    assert str(parse_matcher("  team =~ \"a b\"  ")) == 'team=~"a b"'
    assert str(parse_matcher("a=\nx\n\n")) == 'a="x"'
    with pytest.raises(ValueError, match="is not a matcher"):
        parse_matcher("a=x\ny")
    _, seconds = timed(parse_matcher, "a=x" + " " * MB + "y")
    assert seconds < 2.0   # quadratic: an hour
    with pytest.raises(ValueError):
        timed(parse_matcher, "a=x" + " " * MB + "\ny")


def test_a_globs_literal_run_is_found_in_linear_time() -> None:
    from monitor.hub.rules import glob_literal

    def reference(glob: str) -> str:   # the former pattern, fine on short globs
        return max(re.split(r"\[[^\]]*\]|[*?/]", glob), key=len)

    rng = random.Random(35)
    for _ in range(5000):
        glob = "".join(rng.choice("ab[]*?/") for _ in range(rng.randint(0, 12)))
        assert glob_literal(glob) == reference(glob), glob
    for hostile in ("[" * MB, "[a" * (MB // 2) + "]", "x[" * (MB // 2)):
        _, seconds = timed(glob_literal, hostile)
        assert seconds < 2.0   # quadratic: an hour


def _watch_rule(name_glob: str):
    from monitor.hub.rules import WatchRule

    return WatchRule(name="r", author="org", name_glob=name_glob)


def test_a_name_glob_answers_as_fnmatch_on_random_globs_and_names() -> None:
    import fnmatch
    import warnings

    rng = random.Random(72)
    parts = ["*", "**", "?", "a", "b", "z", "/", "[", "]", "!", "-", "^", "\\", ".", "é", "[a-c]", "[!a]", "[z-a]",
             "[]]", "[!]", "[[:a]", "&", "|", "~", "(", "\n"]
    compared = 0
    for _ in range(4000):
        glob = "".join(rng.choice(parts) for _ in range(rng.randint(1, 8)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)   # re's "possible nested set" on '[['
            try:
                fnmatch.fnmatchcase("", glob)
            except re.error:
                continue   # fnmatch itself cannot compile it
        rule = _watch_rule(glob)
        for _ in range(6):
            name = "".join(rng.choice("abz[]!-^\\/.é&|~(\n") for _ in range(rng.randint(0, 7)))
            repo = name if "/" in glob else "org/" + name
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                expected = fnmatch.fnmatchcase(name, glob) if "/" not in glob else fnmatch.fnmatchcase(repo, glob)
            assert rule.matches_name(repo) == expected, (glob, repo)
            compared += 1
    assert compared > 20_000


def test_a_name_glob_is_matched_in_linear_time() -> None:
    """The real matchers (the poller's and the outbox's) on the longest globs a rule may hold
    against a 50,000-character repo id from a hostile mirror."""
    from monitor.alerts.prediction_eval import watches

    long_id = "org/" + "a" * 50_000
    for glob in ("*a" * 127 + "*b", "[" * 255 + "]", "[" * 256, "*[!a]" * 50 + "*", "?" * 60 + "*" + "?" * 60 + "b"):
        rule = _watch_rule(glob)
        _, seconds = timed(lambda: [rule.matches_name(long_id), rule.matches_name(long_id + "b"),
                                    watches(SimpleNamespace(watch=[rule]), long_id, None)])
        assert seconds < 1.0, glob
    assert _watch_rule("*a" * 127 + "*b").matches_name(long_id + "b")


def test_a_long_name_glob_is_refused_in_one_line_at_once(tmp_path) -> None:
    from monitor.errors import PolicyError
    from monitor.hub.rules import load_watch_rules

    assert _watch_rule("[" * 256).matches_name("org/" + "[" * 256)
    path = tmp_path / "rules.yaml"
    path.write_text("watch:\n  - name: r\n    author: org\n    name_glob: '" + "[" * 40_000 + "'\n")
    start = time.perf_counter()
    with pytest.raises(PolicyError) as info:
        load_watch_rules(path)   # 40 s before, in fnmatch's quadratic translation, and then accepted
    assert time.perf_counter() - start < 1.0
    line = info.value.one_line()
    assert line.startswith(f"{path}: watch[0].name_glob: a name_glob is at most 256 characters, this one has "
                           "40,000 (a Hub repo id is at most 96)")
    assert len(line) < 400 and "\n" not in line
