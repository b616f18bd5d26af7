"""Regular expressions users write (policy route and silence matchers, watch-rule branch and
tag patterns, corpus slice-rule globs) run on RE2 (`monitor.patterns`): against names the Hub
or a corpus folder controls they take time linear in the name whatever the pattern, a pattern
RE2 refuses is refused when it is read with one line naming the file, the key and the
pattern, and the answers are Python `re`'s, checked here against `re` itself.

The timing checks run in a subprocess with a timeout: on a backtracking engine they do not
finish (Python's `re` holds the GIL and ignores signals while it matches), and a test that
hangs the suite is no test."""

from __future__ import annotations

import ast
import json
import random
import re
import subprocess
import sys
import textwrap
import unicodedata
from pathlib import Path

import pytest

from monitor.errors import CorpusError, PolicyError
from monitor.patterns import PatternError, compile_linear

ROOT = Path(__file__).resolve().parents[1]
HOSTILE_NAME = "a" * 50_000 + "b"   # `(a+)+$` tries 2^50000 splits of it on a backtracking engine
BACKREFERENCE = r"(a)\1"
POLICY = """\
name: p
route:
  receiver: a
  routes:
    - {receiver: a, matchers: ['repo=~MATCHER']}
receivers: [{name: a, file: {path: a.jsonl}}]
"""


def seconds_in_a_child(code: str, *, limit_s: float = 60) -> float:
    """Run `code` in a fresh interpreter; what it prints last is the seconds its timed part
    took. A child still running after `limit_s` fails the test instead of hanging it."""
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              cwd=ROOT, timeout=limit_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still matching after {limit_s} s (a backtracking engine)")
    assert done.returncode == 0, done.stderr[-3000:]
    return float(done.stdout.split()[-1])


# -- linear time -------------------------------------------------------------------------------
def test_a_nested_quantifier_in_a_policy_matcher_is_linear_in_the_label(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(POLICY.replace("MATCHER", "(a+)+$"))
    seconds = seconds_in_a_child(f"""
        import time
        from monitor.alerts import route_alert
        from monitor.policy import load_policy
        route = load_policy({str(tmp_path / "p.yaml")!r}).route
        start = time.perf_counter()
        [target] = route_alert(route, {{"repo": {HOSTILE_NAME!r}}})
        assert target.path == "route", target   # the child did not match: the root took it
        [target] = route_alert(route, {{"repo": "aaaa"}})
        assert target.path == "route.routes[0]", target
        print(time.perf_counter() - start)
        """)
    assert seconds < 1.0


def test_a_nested_quantifier_in_a_silence_added_through_the_api_is_linear_in_the_labels() -> None:
    seconds = seconds_in_a_child(f"""
        import contextlib, tempfile, time
        from pathlib import Path
        from types import SimpleNamespace
        import httpx
        from monitor.service.api import ApiServer

        class Store:   # what adding a silence reads and writes
            rows = []
            def add_silence(self, row):
                self.rows.append(row)
            def current_alert_labels(self):
                return [{{"repo": {HOSTILE_NAME!r}, "policy": "p"}}, {{"repo": "aaa", "policy": "p"}}]

        class Daemon:
            def __init__(self, folder):
                self.config = SimpleNamespace(state_dir=folder, policies_dir=folder, webhook_secret_file=None)
            @contextlib.contextmanager
            def job_store(self):
                yield Store()

        token = "t" * 32
        with tempfile.TemporaryDirectory() as folder, \\
                ApiServer(Daemon(Path(folder)), port=0, token=token, workers=2) as server:
            start = time.perf_counter()
            answer = httpx.post(server.url + "/silences", headers={{"Authorization": "Bearer " + token}},
                                json={{"match": ["repo=~(a+)+$"], "until": "2h", "comment": "hostile",
                                      "now": "2030-01-01T00:00:00Z"}}, timeout=60)
            took = time.perf_counter() - start
            assert answer.status_code == 200, answer.text
            assert answer.json()["matches_current"] == 1, answer.text   # 'aaa', not the hostile name
            refused = httpx.post(server.url + "/silences", headers={{"Authorization": "Bearer " + token}},
                                 json={{"match": [{"repo=~" + BACKREFERENCE!r}], "until": "2h", "comment": "x"}},
                                 timeout=60)
            assert refused.status_code == 400, refused.text
            message = refused.json()["error"]
            assert "backreferences and lookaround are not supported" in message and "\\n" not in message, message
            assert len(Store.rows) == 1   # the refused one was not stored
        print(took)
        """)
    assert seconds < 1.0


def test_a_nested_quantifier_in_a_watch_rule_tag_pattern_is_linear_in_the_ref_name(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text("watch:\n  - name: t\n    author: org\n"
                                         "    revisions: {tags: '(a+)+$', branches: 'step\\d+'}\n")
    seconds = seconds_in_a_child(f"""
        import time
        from monitor.hub.rules import load_watch_rules
        [rule] = load_watch_rules({str(tmp_path / "rules.yaml")!r})
        start = time.perf_counter()
        assert not rule.revisions.matches("tag", {HOSTILE_NAME!r})
        assert rule.revisions.matches("tag", {HOSTILE_NAME[:-1]!r})
        assert not rule.revisions.matches("branch", "step" + "1" * 50_000 + "x")
        print(time.perf_counter() - start)
        """)
    assert seconds < 1.0


def test_slice_rule_globs_with_many_stars_are_linear_in_the_file_name() -> None:
    seconds = seconds_in_a_child("""
        import time
        from monitor.scoring.corpus_build import glob_to_regex
        start = time.perf_counter()
        assert not glob_to_regex("*a*a*a*a*b").fullmatches("a" * 200)   # 7.8 s on Python's re
        assert not glob_to_regex("*****b").fullmatches("x" * 100)        # 4.4 s
        assert not glob_to_regex("*a" * 40 + "*b").fullmatches("a" * 50_000)
        assert glob_to_regex("*a*a*a*a*b").fullmatches("a" * 200 + "b")
        print(time.perf_counter() - start)
        """)
    assert seconds < 1.0


# -- refused when read, in one line ------------------------------------------------------------
def test_a_backreference_in_a_policy_matcher_is_refused_at_load_in_one_line(tmp_path: Path) -> None:
    from monitor.policy import load_policy

    path = tmp_path / "p.yaml"
    path.write_text(POLICY.replace("MATCHER", BACKREFERENCE))
    with pytest.raises(PolicyError) as err:
        load_policy(path)
    [line] = err.value.one_line().splitlines()
    assert line.startswith(f"{path}:5: route.routes[0].matchers[0]: value '(a)\\\\1' is not a regular "
                           "expression RE2 accepts (backreferences and lookaround are not supported)"), line
    for lookaround in ("x(?=y)", "(?<!x)y"):
        path.write_text(POLICY.replace("MATCHER", lookaround))
        with pytest.raises(PolicyError, match="lookaround are not supported"):
            load_policy(path)


def test_a_backreference_in_a_watch_rule_is_refused_at_load_in_one_line(tmp_path: Path) -> None:
    from monitor.hub.rules import load_watch_rules

    path = tmp_path / "rules.yaml"
    path.write_text("watch:\n  - name: t\n    author: org\n    revisions: {branches: '(?P<s>x)(?P=s)'}\n")
    with pytest.raises(PolicyError) as err:
        load_watch_rules(path)
    [line] = err.value.one_line().splitlines()
    assert line.startswith(f"{path}: watch[0].revisions.branches: value '(?P<s>x)(?P=s)' is not "
                           "a regular expression RE2 accepts (backreferences and lookaround are not supported)")
    # a megabyte pattern is quoted in part: the line stays readable
    path.write_text("watch:\n  - name: t\n    author: org\n    revisions: {tags: '" + "(a)\\1" * 200_000 + "'}\n")
    with pytest.raises(PolicyError) as err:
        load_watch_rules(path)
    assert len(err.value.one_line()) < 700


def test_a_silence_with_a_backreference_is_refused_and_nothing_is_stored(tmp_path: Path) -> None:
    from datetime import datetime, timezone

    from monitor.alerts import add_silence
    from monitor.store import Store

    with Store.open(tmp_path / "s.duckdb") as store:
        with pytest.raises(PolicyError) as err:
            add_silence(store, ["policy=p", f"repo=~{BACKREFERENCE}"], until=datetime(2031, 1, 1, tzinfo=timezone.utc),
                        comment="x", now=datetime(2030, 1, 1, tzinfo=timezone.utc))
        assert err.value.one_line().startswith(
            "--match 'repo=~(a)\\\\1': value '(a)\\\\1' is not a regular expression RE2 accepts "
            "(backreferences and lookaround are not supported)")
        assert store.silences() == []


LONG = 60_000
# A matcher 60,000 characters long in each way add_silence refuses one (not a matcher, a bad
# pattern, a value no alert can have), and an --until as long.
LONG_MATCHERS = ["a=x\ny" + "z" * LONG, "repo=~(a)\\1" + "a" * LONG, "state=" + "x" * LONG]


def test_a_long_silence_matcher_is_refused_in_one_short_line(tmp_path: Path) -> None:
    from datetime import datetime, timezone

    from monitor.alerts import add_silence
    from monitor.alerts.silences import parse_until
    from monitor.store import Store

    now = datetime(2030, 1, 1, tzinfo=timezone.utc)
    with Store.open(tmp_path / "s.duckdb") as store:
        for text in LONG_MATCHERS:
            with pytest.raises(PolicyError) as err:
                add_silence(store, ["policy=p", text], until=datetime(2031, 1, 1, tzinfo=timezone.utc),
                            comment="x", now=now)
            line = err.value.one_line()
            assert line.startswith(f"--match {text[:20]!r}"[:-1]) and len(line) < 400, line[:500]
        assert store.silences() == []
    for text in ("9" * LONG + "d", "x" * LONG):
        with pytest.raises(PolicyError) as err:
            parse_until(text, now=now)
        assert len(err.value.one_line()) < 400


def test_a_long_silence_matcher_posted_to_the_api_is_refused_in_one_short_line(tmp_path: Path) -> None:
    import contextlib
    from types import SimpleNamespace

    import httpx

    from monitor.service.api import ApiServer

    class FakeStore:   # what adding a silence reads and writes
        rows: list = []

        def add_silence(self, row):
            self.rows.append(row)

        def current_alert_labels(self):
            return []

    class Daemon:
        config = SimpleNamespace(state_dir=tmp_path, policies_dir=tmp_path, webhook_secret_file=None)

        @contextlib.contextmanager
        def job_store(self):
            yield FakeStore()

    token = "t" * 32
    with ApiServer(Daemon(), port=0, token=token, workers=2) as server:
        for text in LONG_MATCHERS:
            answer = httpx.post(server.url + "/silences", headers={"Authorization": "Bearer " + token},
                                json={"match": [text], "until": "2h", "comment": "x",
                                      "now": "2030-01-01T00:00:00Z"}, timeout=60)
            assert answer.status_code == 400, answer.text[:300]
            message = answer.json()["error"]
            assert message.startswith("--match ") and len(message) < 400 and "\n" not in message, message[:500]
    assert FakeStore.rows == []


def test_a_bad_glob_class_is_a_corpus_error_naming_the_rule(tmp_path: Path) -> None:
    from monitor.scoring.corpus_build import load_slice_rules

    path = tmp_path / "rules.yaml"
    path.write_text("name: c\nversion: v1\nrules:\n  - {glob: '*.txt', slice: a}\n  - {glob: 'x[z-a].md', slice: b}\n")
    with pytest.raises(CorpusError) as err:
        load_slice_rules(path)   # Python's re raised re.error here, a traceback
    assert err.value.one_line() == (f"{path}: rules[1].glob: 'x[z-a].md' is not a glob: invalid character "
                                    "class range: z-a; use *, **, ? and [...] classes such as [a-z] or [!_]")


def test_a_stored_silence_an_older_release_accepted_silences_nothing_and_is_reported_once(caplog) -> None:
    import logging
    from datetime import datetime, timezone

    from monitor.alerts.dispatcher import readable_silences
    from monitor.store.rows import SilenceRow

    when = datetime(2030, 1, 1, tzinfo=timezone.utc)
    rows = [SilenceRow.from_row({"id": ident, "matchers": matchers, "starts_at": when, "ends_at": when,
                                 "comment": "c", "created_by": "u", "created_at": when, "expired_at": None})
            for ident, matchers in (("old", ['repo=~"(a)\\\\1"']), ("ok", ['repo=~"a+"']))]
    with caplog.at_level(logging.INFO, logger="lstar.events"):
        assert [s.id for s in readable_silences(rows)] == ["ok"]
        assert [s.id for s in readable_silences(rows)] == ["ok"]
    unreadable = [r.getMessage() for r in caplog.records if r.getMessage().startswith("silence_unreadable")]
    assert len(unreadable) == 1 and "silence=old" in unreadable[0]


# -- the answers are Python re's ---------------------------------------------------------------
def test_patterns_answer_as_python_re_on_random_patterns_and_names() -> None:
    rng = random.Random(2024)
    atoms = ["a", "b", ".", "[ab]", "[^a]", "\\d", "(a|b)", "(?:ab)", "x"]
    compared = 0
    for _ in range(3000):
        pattern = "".join(rng.choice(atoms) + rng.choice(["", "*", "+", "?", "{1,2}", "*?"])
                          for _ in range(rng.randint(1, 4)))
        if rng.random() < 0.2:
            pattern = "(?i)" + pattern.upper()
        reference = re.compile(pattern)
        ours = compile_linear(pattern)
        for _ in range(5):
            name = "".join(rng.choice("abAB1x/-") for _ in range(rng.randint(0, 8)))
            assert ours.fullmatches(name) == (reference.fullmatch(name) is not None), (pattern, name)
            assert ours.searches(name) == (reference.search(name) is not None), (pattern, name)
            compared += 1
    assert compared == 15_000
    assert compile_linear("caf.").fullmatches("café") and compile_linear("[é]").fullmatches("é")
    assert not compile_linear("a").fullmatches("a\ud800") and compile_linear("a.").fullmatches("a\ud800")


def _old_glob_to_regex(glob: str) -> re.Pattern[str]:
    """The former translation on Python's re (fine on short names): the reference."""
    out, i = [], 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        elif glob[i] == "[" and "]" in glob[i + 2:]:
            end = glob.index("]", i + 2)
            body = glob[i + 1:end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return re.compile("".join(out))


def test_globs_answer_as_the_former_translation_on_random_globs_and_paths() -> None:
    import warnings

    from monitor.scoring.corpus_build import glob_to_regex

    rng = random.Random(7)
    for _ in range(3000):
        glob = "".join(rng.choice(["*", "**", "**/", "?", "a", "b", "/", ".", "[ab]", "[!a]", "[[:a]", "-", " ", "é"])
                       for _ in range(rng.randint(1, 6)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)   # re's "possible nested set" on '[['
            reference = _old_glob_to_regex(glob)
        ours = glob_to_regex(glob)
        for _ in range(5):
            path = "".join(rng.choice("ab/.:[ -é") for _ in range(rng.randint(0, 8)))
            assert ours.fullmatches(path) == (reference.fullmatch(path) is not None), (glob, path)


def test_a_pattern_too_large_for_its_memory_bound_is_refused() -> None:
    with pytest.raises(PatternError, match="pattern too large"):
        compile_linear("\\pL{1000}")
    with pytest.raises(PatternError, match="lone surrogate"):
        compile_linear("a\ud800")


# -- one place compiles them -------------------------------------------------------------------
_NAMES_RE = re.compile(r"\b(?:re|regex)\b")
_RE_CALLS = {"compile", "search", "match", "fullmatch", "sub", "subn", "split", "findall", "finditer"}


def _runtime_patterns(path: Path, root: Path = ROOT) -> list[str]:
    """Calls of `re.X(pattern, ...)` inside functions whose pattern is not a literal: a pattern
    made at run time, from a file, a request or the Hub (module-level patterns are the code's own)."""
    text = path.read_text(encoding="utf-8")
    # Such a call names `re` or `regex` (identifiers are read NFKC-normalised); a file that never
    # does has none, and is not parsed: parsing and walking all of monitor/ cost 2.3 CPU-seconds,
    # and about three files in four never name either.
    if not _NAMES_RE.search(unicodedata.normalize("NFKC", text)):
        return []
    tree = ast.parse(text)
    found = []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        for node in ast.walk(func):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in ("re", "regex")
                    and node.func.attr in _RE_CALLS and node.args
                    and not (isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, (str, bytes)))):
                found.append(f"{path.relative_to(root)}:{node.lineno}: re.{node.func.attr} of a pattern made at run time")
    return found


def test_only_monitor_patterns_compiles_a_pattern_from_user_text() -> None:
    """No module but monitor/patterns.py hands a pattern made at run time to Python's re, and
    only it imports re2 (so every user pattern gets its memory bound and its errors)."""
    offenders = []
    for path in sorted((ROOT / "monitor").rglob("*.py")):
        offenders += _runtime_patterns(path)
        if path != ROOT / "monitor" / "patterns.py" and re.search(r"^\s*(import|from)\s+re2\b", path.read_text(), re.M):
            offenders.append(f"{path.relative_to(ROOT)}: imports re2 itself")
    assert offenders == []
    for name in ("policy/matchers.py", "hub/rules.py", "scoring/corpus_build.py"):
        text = (ROOT / "monitor" / name).read_text()
        assert re.search(r"\bcompile_(linear|glob)\(", text)
        assert not re.search(r"\bre\.(compile|fullmatch|match|search)\((?!r?[\"'])", text)
    # fnmatch translates on Python's re: a user's glob against a name the Hub gives is RE2's
    for name in ("hub/rules.py", "alerts/prediction_eval.py"):
        assert not re.search(r"^\s*(import|from)\s+fnmatch\b", (ROOT / "monitor" / name).read_text(), re.M), name


def test_the_checker_finds_a_runtime_pattern(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import re\nX = re.compile('a' + 'b')\n\ndef f(value):\n    return re.fullmatch(value, 'x')\n"
                      "\ndef g(text):\n    return re.fullmatch(r'[0-9]+', text)\n")
    assert _runtime_patterns(sample, tmp_path) == ["sample.py:5: re.fullmatch of a pattern made at run time"]


def test_a_rule_that_has_matched_equals_a_fresh_one() -> None:
    """What matching compiles is kept outside the rule: policies compare equal across reloads."""
    import pickle

    from monitor.hub.rules import WatchRule

    rule = WatchRule(name="s", author="a", revisions={"branches": r"step\d+"})
    assert rule.revisions.matches("branch", "step1") and not rule.revisions.matches("branch", "step1x")
    assert rule == WatchRule(name="s", author="a", revisions={"branches": r"step\d+"}) == pickle.loads(pickle.dumps(rule))
