"""Patterns applied to hostile text (curve files, policy matchers and silences, watch-rule
globs) take time linear in it: a megabyte-long adversarial line is read in well under a second
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
