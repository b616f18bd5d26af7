"""Policy files: strict schema, exact error lines (file:line: key path: value), the
`lstar policy check|test` commands, and keeping the last good policy (docs/reliability.md row 18)."""

from __future__ import annotations

import json
import os
import shutil
from datetime import timedelta
from pathlib import Path

import pytest

from monitor.cli import main
from monitor.errors import PolicyError
from monitor.files import POLICY_MAX_BYTES
from monitor.policy.load import PolicySet, check_policy_files, load_policy
from monitor.policy.schema import format_duration, parse_duration
from monitor.yamlio import ALIAS_EXPANSION_LIMIT, NESTING_LIMIT, NODE_LIMIT, compose

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path("tests/fixtures/policies")  # relative: error lines name files as given

MINIMAL = """\
name: p
route:
  receiver: log
receivers:
  - name: log
    file: {path: alerts.jsonl}
"""


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


def _error(path: Path) -> str:
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    return info.value.message


# -- the fixture folder through `lstar policy check` ---------------------------------------------
EXPECTED_CHECK = """\
FAILED tests/fixtures/policies/bad-alias-bomb.yaml:7: aliases expand to more than 10,000 nodes (an alias bomb?); write the values out instead
FAILED tests/fixtures/policies/bad-duplicate-key.yaml:7: receivers[0].file: duplicate key
FAILED tests/fixtures/policies/bad-missing-curve.yaml:4: tasks[0].curve: curve file 'curves/nope.json' does not exist (paths are relative to the policy file)
FAILED tests/fixtures/policies/bad-python-tag.yaml:6: receivers[0].file: tag '!!python/object/apply:os.system' is not allowed; policy files hold only strings, numbers, booleans, null, lists and mappings
FAILED tests/fixtures/policies/bad-syntax.yaml:4: YAML syntax error: mapping values are not allowed here
FAILED tests/fixtures/policies/bad-type.yaml:5: tasks[0].margin: value 'x' is not a number
FAILED tests/fixtures/policies/bad-type.yaml:8: route.repeat_interval: value 4 is not a duration (write it with units: 30s, 5m, 4h, 1d)
FAILED tests/fixtures/policies/bad-undefined-receiver.yaml:6: route.routes[0].receiver: receiver 'pager' is not defined (defined: log)
FAILED tests/fixtures/policies/bad-unknown-key.yaml:4: route.repeat_intervall: unknown key (did you mean 'repeat_interval'?); allowed: continue, group_by, group_interval, group_wait, matchers, receiver, repeat_interval, routes
SUCCESS tests/fixtures/policies/good-full.yaml
SUCCESS tests/fixtures/policies/good-minimal.yaml
"""


def test_check_folder_prints_exact_lines_and_fails(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LSTAR_TEST_SECRET", "whsec_c2VjcmV0")   # good-full's webhook secret resolves
    code = main(["policy", "check", str(FIXTURES)])
    out, err = capsys.readouterr()
    assert out == EXPECTED_CHECK
    assert code != 0
    assert err.strip() == "error: 8 of 10 policy file(s) failed the check"


def test_check_exits_zero_only_when_every_file_passes(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LSTAR_TEST_SECRET", "LSTAR_WEBHOOK_SECRET", "LSTAR_SMTP_PASSWORD"):
        monkeypatch.setenv(name, "whsec_c2VjcmV0")   # the secrets the receivers name resolve
    good = [str(FIXTURES / "good-full.yaml"), str(FIXTURES / "good-minimal.yaml"), "policies/example.yaml"]
    assert main(["policy", "check", *good]) == 0
    assert capsys.readouterr().out.splitlines() == [f"SUCCESS {g}" for g in good]
    assert main(["policy", "check", good[0], str(FIXTURES / "bad-type.yaml")]) != 0


def test_python_tag_is_refused_before_anything_is_constructed(tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    path = tmp_path / "evil.yaml"
    path.write_text(f'name: x\nroute: !!python/object/apply:os.system ["touch {canary}"]\n')
    assert _error(path) == (f"{path}:2: route: tag '!!python/object/apply:os.system' is not allowed; "
                            "policy files hold only strings, numbers, booleans, null, lists and mappings")
    assert not canary.exists()


def test_a_tag_is_refused_naming_the_kind_of_file_read(tmp_path: Path) -> None:
    """The bounded loader reads config, watch-rules, slice-rules and campaign files too: its
    refusal says what such a file may hold, not what a policy file may."""
    from monitor.calibrate.campaign import parse_campaign
    from monitor.errors import CampaignError
    from monitor.hub.rules import RULES_FILE
    from monitor.scoring.corpus_build import SLICE_RULES_FILE
    from monitor.service.settings import CONFIG_FILE
    from monitor.yamlio import load_yaml_file

    tagged = tmp_path / "tagged.yaml"
    tagged.write_text("name: !!python/name:os.system x\n")
    for kind in (CONFIG_FILE, RULES_FILE, SLICE_RULES_FILE):
        with pytest.raises(PolicyError) as err:
            load_yaml_file(tagged, what=kind)
        assert err.value.message == (f"{tagged}:1: name: tag '!!python/name:os.system' is not allowed; "
                                     f"{kind.plural} hold only strings, numbers, booleans, null, lists and mappings")
    with pytest.raises(CampaignError) as err:
        parse_campaign(tagged.read_text(), "c.yaml", base=tmp_path)
    assert err.value.message == ("c.yaml:1: name: tag '!!python/name:os.system' is not allowed; "
                                 "campaign files hold only strings, numbers, booleans, null, lists and mappings")
    assert _error(tagged).endswith("; policy files hold only strings, numbers, booleans, null, lists and mappings")


def test_alias_bomb_is_refused_quickly() -> None:
    # The file would expand to 9^9 strings; refusal must come from the composed graph.
    message = _error(FIXTURES / "bad-alias-bomb.yaml")
    assert f"more than {ALIAS_EXPANSION_LIMIT:,} nodes" in message


def test_a_few_aliases_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "aliases.yaml"
    path.write_text(MINIMAL + "meta_receivers: &m [log]\nreports:\n  - name: r\n"
                    "    schedule: {every: 1d}\n    receivers: *m\n")
    assert load_policy(path).reports[0].receivers == ["log"]


def test_recursive_alias_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text("name: &a [*a]\n")
    assert _error(path) == f"{path}:1: name[0]: recursive alias; a value cannot contain itself"


def test_size_limit_and_encoding(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text(MINIMAL + "description: " + "x" * POLICY_MAX_BYTES + "\n")
    size = big.stat().st_size
    assert _error(big) == (f"{big}: file is {size:,} bytes; policy files are limited to "
                           f"{POLICY_MAX_BYTES:,} bytes")
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: caf\xe9\n")
    assert _error(latin) == f"{latin}: not UTF-8 text (byte 9)"


def test_every_error_of_a_file_is_listed_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "many.yaml"
    path.write_text("""\
name: many
tasks:
  - name: t
    curve: c.json
    margin: 2
route:
  receiver: log
  group_by: [policy, "bad label"]
receivers:
  - name: log
    email: {to: nobody, from: a@b.c, host: h, tls: sometimes}
""")
    assert _error(path).splitlines() == [
        f"{path}:5: tasks[0].margin: value 2 must be at most 1.0",
        f"{path}:8: route.group_by: value 'bad label' is not a label name",
        f"{path}:11: receivers[0].email.to: value 'nobody' is not an email address",
        f"{path}:11: receivers[0].email.tls: value 'sometimes' is not one of 'none', 'starttls' or 'ssl'",
    ]


def test_missing_keys_and_wrong_shapes(tmp_path: Path) -> None:
    path = tmp_path / "shape.yaml"
    path.write_text("name: s\nroute: {}\nreceivers:\n  - name: hook\n    webhook: {url: ftp://x}\n"
                    "  - name: two\n    file: {path: a}\n    webhook: {url: 'http://x'}\n")
    assert _error(path).splitlines() == [
        f"{path}:2: route.receiver: missing required key",
        f"{path}:5: receivers[0].webhook.url: value 'ftp://x' is not an http(s) URL",
        f"{path}:6: receivers[1]: give exactly one of webhook, email, file (got webhook, file)",
    ]
    top = tmp_path / "list.yaml"
    top.write_text("- a\n- b\n")
    assert _error(top) == f"{top}:1: expected a mapping at the top level, got list"
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    assert _error(empty) == f"{empty}:1: the file is empty; a policy needs name, route and receivers"


def test_union_value_and_watch_rule_errors(tmp_path: Path) -> None:
    path = tmp_path / "watch.yaml"
    path.write_text(MINIMAL + "watch:\n  - name: w\n    author: x\n    revisions: mian\n")
    assert _error(path) == f"{path}:10: watch[0].revisions: value 'mian' is not one of 'main' or a mapping"


def test_a_glob_only_watch_rule_without_a_searchable_literal_is_refused(tmp_path: Path, capsys) -> None:
    """A rule with only a name glob is polled by a `search` on its literal part; a glob with no
    literal part long enough would list the whole Hub, so `policy check` refuses it."""
    path = tmp_path / "glob.yaml"
    path.write_text(MINIMAL + "watch:\n  - name: sevens\n    name_glob: '*-7B*'\n")
    message = _error(path)
    assert message.startswith(f"{path}:8: watch[0]: ") and "watch rule 'sevens'" in message
    assert "name_glob '*-7B*' has no literal part of at least 4 characters" in message
    assert "add `author` or `search`" in message and "\n" not in message
    assert main(["policy", "check", str(path)]) != 0
    assert f"FAILED {path}:8: watch[0]:" in capsys.readouterr().out

    path.write_text(MINIMAL + "watch:\n  - name: llamas\n    name_glob: '*Llama-3*-8B'\n")
    assert load_policy(path).watch[0].list_params() == {"search": "Llama-3"}


def test_cross_references(tmp_path: Path) -> None:
    curve = tmp_path / "arith.json"
    shutil.copy(FIXTURES / "curves" / "arith.json", curve)
    path = tmp_path / "xref.yaml"
    path.write_text(f"""\
name: x
corpora: {{public: {"ab" * 32}}}
tasks:
  - name: arith
    curve: arith.json
    confidence: 0.95
  - name: arith
    curve: arith.json
calibration_gaming:
  reference_checkpoints: [org/m@abc]
route:
  receiver: log
receivers:
  - name: log
    file: {{path: a}}
meta_receivers: [log, pager]
reports:
  - name: weekly
    schedule: {{cron: "0 9 * * MON"}}
    receivers: [mail]
""")
    assert _error(path).splitlines() == [
        f"{path}:5: tasks[0].curve: curve 'arith.json' was fitted on corpus 9f269a7db0b1, not on corpora.public abababababab",
        f"{path}:6: tasks[0].confidence: value 0.95 differs from the 0.9 band of curve 'arith.json'; refit the curve at this confidence or drop the key",
        f"{path}:7: tasks[1].name: task 'arith' is defined twice",
        f"{path}:8: tasks[1].curve: curve 'arith.json' was fitted on corpus 9f269a7db0b1, not on corpora.public abababababab",
        f"{path}:9: calibration_gaming: needs corpora.private (the governance corpus) beside corpora.public",
        f"{path}:16: meta_receivers[1]: receiver 'pager' is not defined (defined: log)",
        f"{path}:20: reports[0].receivers[0]: receiver 'mail' is not defined (defined: log)",
    ]


def test_defaults_follow_alertmanager() -> None:
    policy = load_policy(FIXTURES / "good-minimal.yaml")
    route = policy.route
    assert route.group_by == ["policy", "repo", "commit"]
    assert (route.group_wait, route.group_interval, route.repeat_interval) == (
        timedelta(seconds=30), timedelta(minutes=5), timedelta(hours=4))
    full = load_policy(FIXTURES / "good-full.yaml")
    assert full.receiver("hook").resolved_notifications is True
    assert full.receiver("mail").resolved_notifications is False
    assert full.receiver("hook").webhook.timeout == timedelta(seconds=2)
    assert full.path == FIXTURES / "good-full.yaml"
    assert full.resolve_path("curves/arith.json") == FIXTURES / "curves" / "arith.json"


@pytest.mark.parametrize("text,seconds", [("30s", 30), ("5m", 300), ("4h", 14400), ("1d", 86400),
                                          ("1h30m", 5400), ("2w", 1209600), ("1500ms", 1.5), ("0s", 0)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == seconds
    assert parse_duration(format_duration(parse_duration(text))) == parse_duration(text)


@pytest.mark.parametrize("bad", ["", "4", "4x", "h", "-1h", "1.5h", "1m1h"])
def test_bad_durations(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_last_good_policy_is_kept_on_a_bad_reload(tmp_path: Path) -> None:
    path = tmp_path / "live.yaml"
    path.write_text(MINIMAL)
    live = PolicySet([path])
    assert live.reload() == {}
    assert [p.name for p in live.current()] == ["p"]
    path.write_text(MINIMAL.replace("receiver: log", "receiver: log\n  group_wait: soon"))
    errors = live.reload()
    assert errors == {path: f"{path}:4: route.group_wait: value 'soon' is not a duration "
                            "(write it with units: 30s, 5m, 4h, 1d)"}
    assert [p.name for p in live.current()] == ["p"]  # the last good version still rules
    assert live.current()[0].route.group_wait == timedelta(seconds=30)
    path.write_text(MINIMAL.replace("name: p", "name: p2"))
    assert live.reload() == {}
    assert [p.name for p in live.current()] == ["p2"]


def test_check_policy_files_reports_each_file_separately() -> None:
    results = check_policy_files([FIXTURES / "bad-syntax.yaml", FIXTURES / "good-minimal.yaml"])
    assert [r.ok for r in results] == [False, True]
    assert results[0].errors == (
        "tests/fixtures/policies/bad-syntax.yaml:4: YAML syntax error: mapping values are not allowed here",)


# -- lstar policy test -------------------------------------------------------------------------
def test_policy_test_prints_each_task_decision_and_sends_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    from monitor.curves.artifact import load_curve, predict

    code = main(["policy", "test", str(FIXTURES / "good-full.yaml"), "--lstar", "-2.0", "--se", "0.02",
                 "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["sent"] is False and result["policy"] == "full"
    by_task = {t["task"]: t for t in result["tasks"]}
    for name in ("arith", "cloze"):
        expected = predict(load_curve(FIXTURES / "curves" / f"{name}.json"), -2.0, 0.02)
        got = by_task[name]
        assert got["p_hat"] == pytest.approx(expected.p_hat)
        assert got["interval"] == pytest.approx([expected.lower, expected.upper])
        assert got["threshold"] == pytest.approx(0.30)
        # the state follows docs/measurement.md §3 from the interval and b + ε, computed here by hand
        lo, hi = got["interval"]
        assert got["state"] == ("emerged" if lo >= 0.30 else "at_risk" if hi >= 0.30 else "clear")
    assert by_task["arith"]["state"] == "at_risk" and by_task["arith"]["receivers"] == ["hook"]
    assert by_task["cloze"]["state"] == "clear" and by_task["cloze"]["receivers"] == []


def test_policy_test_routes_emerged_to_both_receivers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "test", str(FIXTURES / "good-full.yaml"), "--lstar", "-2.6", "--json"]) == 0
    by_task = {t["task"]: t for t in json.loads(capsys.readouterr().out)["tasks"]}
    assert by_task["arith"]["state"] == "emerged"
    # Alertmanager semantics: the matching child takes the alert; `continue` only lets later
    # siblings match too, and the root handles only alerts no child took.
    assert by_task["arith"]["receivers"] == ["mail"]
    assert main(["policy", "test", str(FIXTURES / "good-full.yaml"), "--lstar", "-2.6"]) == 0
    table = capsys.readouterr().out
    assert "arith" in table and "emerged" in table and "nothing sent" in table


def test_policy_test_on_a_bad_file_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "test", str(FIXTURES / "bad-type.yaml"), "--lstar", "-2"]) == 2
    assert capsys.readouterr().err.startswith(
        "error: tests/fixtures/policies/bad-type.yaml:5: tasks[0].margin: value 'x' is not a number")


# -- hostile files: every failure is a policy error naming the file -------------------------------
DEEP = "[" * 100_000
DEEP_ERROR = f"lists and mappings nested more than {NESTING_LIMIT} levels deep; flatten the structure"


def test_deep_nesting_is_refused_with_file_and_line(tmp_path: Path) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text(DEEP)
    assert _error(flow) == f"{flow}:1: {DEEP_ERROR}"
    block = tmp_path / "block.yaml"
    block.write_text("".join(" " * i + f"k{i}:\n" for i in range(NESTING_LIMIT + 5)))
    # Line n opens the mapping at depth n: the first one past the limit is on line NESTING_LIMIT + 1.
    assert _error(block) == f"{block}:{NESTING_LIMIT + 1}: {DEEP_ERROR}"
    assert compose("[" * NESTING_LIMIT + "]" * NESTING_LIMIT, "ok.yaml") is not None  # the limit itself is fine


@pytest.mark.slow
def test_a_file_of_too_many_values_is_refused(tmp_path: Path) -> None:
    wide = tmp_path / "wide.yaml"
    wide.write_text("[" + "1, " * NODE_LIMIT + "1]")
    assert _error(wide) == (f"{wide}:1: more than {NODE_LIMIT:,} values; "
                            "configuration files are far smaller than that")


def test_a_curve_file_nested_too_deep_is_an_error_of_its_task(tmp_path: Path) -> None:
    (tmp_path / "deep.json").write_text(DEEP)
    path = tmp_path / "p.yaml"
    path.write_text(MINIMAL + "tasks:\n  - {name: t, curve: deep.json}\n")
    message = _error(path)
    assert message.startswith(f"{path}:8: tasks[0].curve: curve file 'deep.json' does not load: ")
    assert "deep.json is not a JSON curve artifact: maximum recursion depth" in message
    assert "\n" not in message


def test_any_other_failure_while_loading_names_the_file(tmp_path: Path) -> None:
    # A path longer than the file system allows makes the existence check itself raise OSError.
    path = tmp_path / "long.yaml"
    path.write_text(MINIMAL.replace("file: {path: alerts.jsonl}",
                                    "webhook: {url: 'http://x', secret_file: " + "x" * 5000 + "}"))
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.message.startswith(f"{path}: cannot be loaded (OSError: [Errno 36] File name too long")
    assert len(info.value.one_line()) < 400 and "`lstar policy check FILE`" in info.value.one_line()


@pytest.mark.parametrize("kind", ["directory", "fifo", "device", "vanished"])
def test_what_is_not_a_regular_file_is_refused_without_reading(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"{kind}.yaml"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)  # no writer: a blocking read would hang for ever
    elif kind == "device":
        path.symlink_to("/dev/zero")  # endless bytes
    expected = {"directory": f"{path}: is a directory, not a policy file",
                "fifo": f"{path}: is a named pipe (FIFO), not a policy file",
                "device": f"{path}: is a character device, not a policy file",
                "vanished": f"{path}: cannot read: No such file or directory"}[kind]
    assert _error(path) == expected
    [result] = check_policy_files([path])
    assert len(result.errors) == 1 and result.errors[0].startswith(expected + "; ")  # with how to fix it


def test_policy_check_on_a_deep_file_is_one_line_and_fails(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(DEEP)
    assert main(["policy", "check", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == f"FAILED {path}:1: {DEEP_ERROR}\n"
    assert err == "error: 1 of 1 policy file(s) failed the check\n"


@pytest.mark.parametrize("byte", ["\x00", "\x07", "\x1b"])
def test_a_control_character_is_one_line_naming_the_file(tmp_path: Path, byte: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The YAML reader refuses control characters as the loader is made; that is a policy
    error like any other, not a traceback."""
    path = tmp_path / "control.yaml"
    path.write_text(MINIMAL.replace("\n", f"  # {byte}\n", 1))
    assert main(["policy", "check", str(path)]) == 2
    out, _ = capsys.readouterr()
    assert out.startswith(f"FAILED {path}: not YAML: unacceptable character #x{ord(byte):04x}")
    assert len(out.splitlines()) == 1


def test_policy_check_of_a_folder_reports_entries_that_are_not_files(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "good.yaml").write_text(MINIMAL)
    (tmp_path / "sub.yaml").mkdir()
    os.mkfifo(tmp_path / "pipe.yaml")
    (tmp_path / ".#good.yaml").symlink_to("nobody@host.1234")  # an editor's lock file: skipped
    assert main(["policy", "check", str(tmp_path)]) == 2
    assert capsys.readouterr().out.splitlines() == [
        f"SUCCESS {tmp_path / 'good.yaml'}",
        f"FAILED {tmp_path / 'pipe.yaml'}: is a named pipe (FIFO), not a policy file; "
        "policy files are regular YAML files; rename or remove it",
        f"FAILED {tmp_path / 'sub.yaml'}: is a directory, not a policy file; "
        "policy files are regular YAML files; rename or remove it"]


def test_reload_keeps_the_last_good_version_when_a_file_turns_hostile(tmp_path: Path) -> None:
    good, other = tmp_path / "a.yaml", tmp_path / "b.yaml"
    good.write_text(MINIMAL.replace("name: p", "name: a"))
    other.write_text(MINIMAL.replace("name: p", "name: b"))
    live = PolicySet([good, other])
    assert live.reload() == {}
    before = live.policies[other]
    other.write_text(DEEP)
    new = tmp_path / "c.yaml"
    new.write_text(MINIMAL.replace("name: p", "name: c"))
    assert live.reload([good, other, new]) == {other: f"{other}:1: {DEEP_ERROR}"}
    assert [p.name for p in live.current()] == ["a", "b", "c"]
    assert live.policies[other] is before
    assert live.reload([good, new]) == {}  # a file that is gone no longer counts
    assert [p.name for p in live.current()] == ["a", "c"]


@pytest.mark.parametrize("value,message", [
    ("101y", "value '101y' is longer than 100 years; write a shorter duration"),
    ("1" * 40 + "s", "is not a duration"),
])
def test_absurd_durations_are_value_errors(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_duration(value)


# -- checks across files and of the receivers' secrets ------------------------------------------
RULE = "watch:\n  - {name: shared, author: org-a}\n"


def test_a_watch_rule_two_files_define_differently_fails_the_check_naming_both(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from monitor.policy.load import load_policies

    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(MINIMAL.replace("name: p", "name: a") + RULE)
    b.write_text(MINIMAL.replace("name: p", "name: b") + RULE)   # the same rule twice: one rule
    assert main(["policy", "check", str(tmp_path)]) == 0
    assert [p.name for p in load_policies([a, b])] == ["a", "b"]
    capsys.readouterr()

    b.write_text(MINIMAL.replace("name: p", "name: b") + RULE.replace("org-a", "org-b"))
    expected = (f"{b}: watch[0].name: watch rule 'shared' is also defined, differently, by {a}; "
                "rename one of them or make both the same")
    assert main(["policy", "check", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"SUCCESS {a}", f"FAILED {expected}"]
    assert err == "error: 1 of 2 policy file(s) failed the check\n"
    with pytest.raises(PolicyError) as info:
        load_policies([a, b])
    assert info.value.message == expected
    live = PolicySet([a, b])
    assert live.reload() == {b: expected}
    assert [p.name for p in live.current()] == ["a"]


def test_policy_check_resolves_every_secret_and_never_prints_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    value = "whsec_dG9wLXNlY3JldC12YWx1ZQ=="
    monkeypatch.setenv("LSTAR_SET_SECRET", value)
    monkeypatch.delenv("LSTAR_UNSET_SECRET", raising=False)
    monkeypatch.setenv("LSTAR_EMPTY_PASSWORD", "")
    (tmp_path / "empty-secret").write_text("  \n")
    (tmp_path / "good-secret").write_text(value + "\n")
    path = tmp_path / "p.yaml"
    path.write_text(MINIMAL + """\
  - name: signed
    webhook: {url: "http://127.0.0.1:9/a", secret_env: LSTAR_SET_SECRET}
  - name: unset
    webhook: {url: "http://127.0.0.1:9/b", secret_env: LSTAR_UNSET_SECRET}
  - name: emptyfile
    webhook: {url: "http://127.0.0.1:9/c", secret_file: empty-secret}
  - name: filed
    webhook: {url: "http://127.0.0.1:9/e", secret_file: good-secret}
  - name: mail
    email: {to: a@example.org, from: b@example.org, host: localhost, username_env: LSTAR_UNSET_SECRET,
            password_env: LSTAR_EMPTY_PASSWORD}
""")
    assert main(["policy", "check", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        f"FAILED {path}: receiver 'unset': webhook.secret_env: environment variable LSTAR_UNSET_SECRET is not "
        "set; export LSTAR_UNSET_SECRET in the daemon's environment",
        f"FAILED {path}: receiver 'emptyfile': webhook.secret_file: {tmp_path / 'empty-secret'} is empty; "
        "write the secret into the file",
        f"FAILED {path}: receiver 'mail': email.username_env: environment variable LSTAR_UNSET_SECRET is not "
        "set; export LSTAR_UNSET_SECRET in the daemon's environment",
        f"FAILED {path}: receiver 'mail': email.password_env: environment variable LSTAR_EMPTY_PASSWORD is "
        "empty; export LSTAR_EMPTY_PASSWORD in the daemon's environment"]
    assert value not in out + err and "dG9wLXNlY3JldC12YWx1ZQ" not in out + err
    assert main(["policy", "check", "--skip-secrets", str(path)]) == 0   # the file itself is valid
