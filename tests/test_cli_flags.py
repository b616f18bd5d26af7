"""Nonsensical numeric and enumerated flags are refused when the command line is parsed: one
line on stderr naming the flag and the allowed values, exit code 2, nothing started."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.cli import main
from monitor.commands.options import describe_range


# TMP stands for the test's own folder; the paths under it do not exist, so a flag that slipped
# through would fail later with another message (for `run`, that the policy folder is missing).
FIT = ["curves", "fit", "--out", "TMP/c.json", "--task", "t", "--labels", "TMP/none.csv",
       "--db", "TMP/none.duckdb"]
RUN = ["run", "--policies", "TMP/none", "--state", "TMP/state", "--once", "--api-port", "0"]
SCORE = ["score", "TMP/none", "--corpus", "TMP/none", "--no-db"]

# (argv, the flag as the error names it, the allowed values as it states them)
CASES = [
    ([*FIT, "--baseline", "0.25", "--margin", "0.1", "--n-boot", "0"], "'--bootstrap' / '--n-boot'",
     "an integer from 50 to 100,000"),
    ([*FIT, "--baseline", "0.25", "--margin", "nan"], "'--margin'", "a number > 0 and ≤ 1"),
    ([*FIT, "--baseline", "-0.5", "--margin", "0.1"], "'--baseline'", "a number ≥ 0 and < 1"),
    ([*FIT, "--baseline", "0.25", "--margin", "0.1", "--confidence", "1"], "'--confidence'",
     "a number > 0 and < 1"),
    ([*FIT, "--baseline", "0.25", "--margin", "0.1", "--seed", "-1"], "'--seed'",
     "an integer from 0 to 4,294,967,295"),
    (["curves", "predict", "TMP/none.json", "--lstar", "inf"], "'--value' / '--lstar'", "a finite number"),
    (["curves", "predict", "TMP/none.json", "--value", "-inf"], "'--value' / '--lstar'", "a finite number"),
    (["curves", "predict", "TMP/none.json", "--lstar", "-2", "--se", "-0.1"], "'--se'", "a number ≥ 0"),
    ([*SCORE, "--docs", "0"], "'--docs'", "an integer ≥ 1"),
    ([*SCORE, "--max-context", "1"], "'--max-context'", "an integer ≥ 2"),
    ([*SCORE, "--stride", "-4"], "'--stride'", "an integer ≥ 1"),
    ([*SCORE, "--batch-size", "0"], "'--batch-size'", "an integer from 1 to 4,096"),
    ([*SCORE, "--pending", "--limit", "0"], "'--limit'", "an integer ≥ 1"),
    ([*RUN, "--n-boot", "0"], "'--n-boot'", "an integer from 2 to 100,000"),
    ([*RUN, "--poll-every", "0s"], "'--poll-every'", "a duration of at least 1s"),
    ([*RUN, "--score-timeout", "0s"], "'--score-timeout'", "a duration of at least 1s"),
    ([*RUN, "--score-memory", "0"], "'--score-memory'", "a size from 256M to 64T"),
    ([*RUN, "--score-memory", "infG"], "'--score-memory'", "a size from 256M to 64T"),
    ([*RUN, "--device", "gpu"], "'--device'", "auto, cpu, cuda or cuda:N"),
    ([*RUN, "--retention", "1h"], "'--retention'", "a duration of at least 1d"),
    ([*RUN, "--api-idle-timeout", "0s"], "'--api-idle-timeout'", "a duration of at least 100ms"),
    ([*RUN, "--api-workers", "0"], "'--api-workers'", "an integer from 1 to 256"),
    ([*RUN, "--api-connection-lifetime", "500ms"], "'--api-connection-lifetime'", "a duration of at least 1s"),
    ([*RUN, "--cache-keep", "-1"], "'--cache-keep'", "a count of checkpoints from 0 to 1,000,000, or 'all'"),
    ([*RUN, "--cache-max-bytes", "12"], "'--cache-max-bytes'", "a size from 1M to 1024T"),
    ([*RUN, "--scoring-workers", "-1"], "'--scoring-workers'", "an integer from 0 to 64"),
    ([*RUN, "--worker-max-jobs", "0"], "'--worker-max-jobs'", "an integer from 1 to 100,000"),
    ([*RUN, "--worker-max-rss", "12"], "'--worker-max-rss'", "a size from 64M to 1024T"),
    (["eval", "TMP/none", "--task", "TMP/none", "--device", "tpu"], "'--device'", "auto, cpu, cuda or cuda:N"),
    (["checkpoints", "--db", "TMP/none.duckdb", "--limit", "0"], "'--limit'", "an integer from 1 to 1,000"),
    (["alerts", "list", "--db", "TMP/none.duckdb", "--limit", "1" + "0" * 400], "'--limit'",
     "an integer from 1 to 1,000"),
    (["policy", "test", "TMP/none.yaml", "--lstar", "nan"], "'--value' / '--lstar'", "a finite number"),
]
IDS = [" ".join(arg[:12] for arg in argv[:2] + argv[-2:]) for argv, _, _ in CASES]


@pytest.mark.parametrize("argv,flag,allowed", CASES, ids=IDS)
def test_nonsensical_flags_are_refused_naming_the_flag_and_the_range(
        argv: list[str], flag: str, allowed: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main([a.replace("TMP", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"error: Invalid value for {flag}: "), err
    assert err.rstrip().endswith(f"give {allowed}"), err
    assert not (tmp_path / "state").exists() and not (tmp_path / "c.json").exists()  # nothing started


def test_ranges_read_as_words() -> None:
    assert describe_range(low=1, integer=True) == "an integer ≥ 1"
    assert describe_range(low=0.0, high=1.0, low_open=True, high_open=True) == "a number > 0 and < 1"
    assert describe_range(high=10.0) == "a number ≤ 10"
    assert describe_range() == "a finite number"


def test_values_in_range_still_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # In range, parsing succeeds and the command runs into the missing files instead.
    code = main(["curves", "fit", "--out", str(tmp_path / "c.json"), "--task", "t", "--baseline", "0",
                 "--margin", "1", "--n-boot", "50", "--confidence", "0.95", "--labels",
                 str(tmp_path / "none.csv")])
    err = capsys.readouterr().err
    assert code == 2 and "Invalid value" not in err and "none.csv" in err, err
