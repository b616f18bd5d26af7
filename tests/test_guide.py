"""docs/guide.md runs as written: every ```bash block after a `<!-- guide-test -->` comment is
executed in order, each `lstar` line through the real command line, against the fake Hub's
`guide` scenario (tiny real models), whose URL replaces the guide's `http://127.0.0.1:8765`
(the guide exports `HF_ENDPOINT` itself), in an empty folder beside the shared data; each
`<!-- guide-file: PATH -->` block is written to PATH first. Each `<!-- guide-expect: CMD -->`
block lists lines the output of the last command starting with CMD contains (runs of spaces
count as one). Blocks without the marker (systemd, Docker, lm-eval) are shown, not run, and
say so."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from standardwebhooks import Webhook

from monitor.demo.fakehub import FakeHub
from monitor.demo.hub_repos import scenario_guide
from monitor.demo.receivers import WebhookReceiver
from monitor.store import Store
from support.daemon_harness import REPO_ROOT

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"
README = Path(__file__).resolve().parents[1] / "README.md"
PRODUCTION_WEBHOOK = "https://hooks.example.org/lstar"
GUIDE_HUB = "http://127.0.0.1:8765"
EXPECT = re.compile(r"<!-- guide-expect: (?P<command>[^>]+?) -->\n```text\n(?P<body>.*?)\n```", re.S)
BLOCK = re.compile(r"<!-- guide-(test|file: (?P<path>[^ ]+)) -->\n```(?P<lang>\w+)\n(?P<body>.*?)\n```", re.S)


def guide_steps(text: str) -> list[tuple[str, str, str | None]]:
    """(kind, body, path) of every marked block, in order: kind is 'test' or 'file'."""
    return [("file" if m.group("path") else "test", m.group("body"), m.group("path")) for m in BLOCK.finditer(text)]


def expectations(text: str) -> list[tuple[str, list[str]]]:
    """(command prefix, lines its output must contain) of every guide-expect block, in order."""
    return [(m.group("command"), [line for line in m.group("body").splitlines() if line.strip()])
            for m in EXPECT.finditer(text)]


def expectations_at(text: str) -> list[tuple[str, list[str], int]]:
    """`expectations`, each with where its block starts in the guide."""
    return [(m.group("command"), [line for line in m.group("body").splitlines() if line.strip()], m.start())
            for m in EXPECT.finditer(text)]


def commands_above(text: str, where: int) -> list[str]:
    """The commands of the tested blocks that end before `where` (with the hub URL as written)."""
    return [line for m in BLOCK.finditer(text) if m.end() <= where and not m.group("path")
            for line in command_lines(m.group("body"))]


def outputs(stdout: str, stderr: str) -> list[tuple[str, str]]:
    """(command line, what it printed on stdout and stderr) of every command the driver ran."""
    def split(text: str) -> list[tuple[str, str]]:
        parts = re.split(r"^\$ (lstar .*)$", text, flags=re.M)
        return list(zip(parts[1::2], parts[2::2]))
    out, err = split(stdout), split(stderr)
    assert [c for c, _ in out] == [c for c, _ in err]
    return [(command, o + e) for (command, o), (_, e) in zip(out, err)]


def squeeze(text: str) -> str:
    return re.sub(r"[ \t]+", " ", text)


def command_lines(body: str) -> list[str]:
    """The block's commands: comments and blank lines dropped, `\\` continuations joined."""
    lines, current = [], ""
    for raw in body.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        current += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            lines.append(current.strip())
            current = ""
    return lines


def test_the_guide_is_linked_and_its_blocks_are_marked() -> None:
    assert "(docs/guide.md)" in README.read_text()
    text = GUIDE.read_text()
    steps = guide_steps(text)
    tested = [line for kind, body, _ in steps if kind == "test" for line in command_lines(body)]
    for needed in ("lstar score ", "lstar eval ", "lstar curves fit ", "lstar curves validate ", "lstar policy check ",
                   "lstar run ", "lstar report ", "lstar runs ", "lstar status "):
        assert any(line.startswith(needed) for line in tested), needed
    # Every fenced shell block is either run by the test or says that it is not.
    for block in re.finditer(r"(?P<before>.{0,30})```bash\n(?P<body>.*?)\n```", text, re.S):
        assert "<!-- guide-test -->" in block.group("before") or "not run by the tests" in block.group("body"), \
            block.group("body")[:200]


# Runs the steps in one fresh interpreter, so HF_ENDPOINT and HF_HOME are set before
# huggingface_hub reads them at import, as in a shell; each `lstar` line goes through the real
# command line (`monitor.cli.main`), in process, to keep torch's import to once; it is imported
# at the first `lstar` line, after the guide's own `export HF_ENDPOINT=...`.
# The guide's three `lstar run --once` share one scoring backend, lent to each daemon as
# `lstar demo` lends its passes one: each run's own backend started a warm-worker template that
# imported torch and transformers again (about 7 CPU-seconds of the test's 70 for the third run;
# the second scores nothing and started none). Scoring still runs in the pool's worker process,
# made on first use from the first run's settings, which all three runs give alike (checked).
DRIVER = """
import json, os, shlex, sys
from pathlib import Path
main = None
lent = {}

def lend_one_scoring_backend():
    import monitor.service.daemon as daemon_module
    made_by = daemon_module.make_scoring_backend

    def make_scoring_backend(config):
        settings = (config.scoring_backend, config.scoring_workers, config.worker_max_jobs, config.worker_max_rss,
                    config.score_timeout, config.score_memory, config.state_dir)
        if "backend" not in lent:
            lent.update(backend=made_by(config), settings=settings)
        if settings != lent["settings"]:
            sys.exit(f"the lent scoring backend was made for {lent['settings']}, not {settings}")
        return lent["backend"]

    class Daemon(daemon_module.Daemon):
        def __init__(self, config, *, backend=None):
            super().__init__(config, backend=backend)
            self.owns_backend = False   # closed by this driver after the last step

    daemon_module.make_scoring_backend = make_scoring_backend
    daemon_module.Daemon = Daemon

for kind, body, path in json.load(open(sys.argv[1])):
    if kind == "file":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(body + "\\n")
        continue
    for line in json.loads(body):
        argv = shlex.split(line)
        if argv[0] == "export":
            name, _, value = argv[1].partition("=")
            os.environ[name] = value
            continue
        if argv[0] != "lstar":
            sys.exit(f"a tested block may hold only lstar and export lines: {line}")
        if main is None:
            from monitor.cli import main
            lend_one_scoring_backend()
        print(f"\\n$ {line}", flush=True)
        print(f"$ {line}", file=sys.stderr, flush=True)
        code = main(argv[1:])
        sys.stdout.flush()
        print(f"exit {code}", file=sys.stderr, flush=True)
        if code != 0:
            sys.exit(f"exit {code}: {line}")
if "backend" in lent:
    print(f"scoring templates started: {lent['backend'].templates_started}", file=sys.stderr, flush=True)
    lent["backend"].close()
"""


@pytest.mark.slow
def test_the_guides_commands_run_against_the_fake_hub(tmp_path: Path, shared_dir: Path) -> None:
    (tmp_path / "shared").symlink_to(shared_dir.resolve(), target_is_directory=True)
    work = tmp_path / "work"  # ../shared from here is the shared data, as beside a checkout
    work.mkdir()
    with FakeHub() as hub, WebhookReceiver() as hook:
        scenario_guide(hub, tmp_path / "hub")
        steps = [(kind, body.replace(PRODUCTION_WEBHOOK, hook.url) if kind == "file"
                  else json.dumps(command_lines(body.replace(GUIDE_HUB, hub.url))), path)
                 for kind, body, path in guide_steps(GUIDE.read_text())]
        (tmp_path / "steps.json").write_text(json.dumps(steps))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "LSTAR_"))}
        # HF_ENDPOINT: the guide's. HF_HUB_OFFLINE set, as the README invites for the demo: every
        # command still reaches the guide's Hub on 127.0.0.1 (docs/guide.md, step 0).
        env.update(HF_HOME=str(tmp_path / "hf-home"), PYTHONPATH=str(REPO_ROOT), HF_HUB_OFFLINE="1")
        proc = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path / "steps.json")], cwd=work, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        # The test message went out signed with the secret the guide exported.
        tests = [r for r in hook.requests if b"LstarTest" in r.body]
        assert len(tests) == 1
        Webhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").verify(tests[0].body, dict(tests[0].headers))
        # The daemon's at-risk alert went out signed too (step 5 says it is delivered), and the
        # policy change of step 6 resolved it: the resolve went to the same webhook, signed, with
        # the labels the alert fired with, judged at the new level (curve baseline 0.25 + the
        # policy's margin 0.25).
        alerts = [r for r in hook.requests if b"LstarTest" not in r.body]
        assert len(alerts) == 2, [r.body[:200] for r in hook.requests]
        sent = [Webhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").verify(r.body, dict(r.headers)) for r in alerts]
        assert [m["status"] for m in sent] == ["firing", "resolved"]
        assert [a["labels"]["state"] for m in sent for a in m["alerts"]] == ["at_risk", "at_risk"]
        assert sent[1]["alerts"][0]["labels"] == sent[0]["alerts"][0]["labels"]
        assert sent[0]["commonLabels"]["repo"] == "demo-org/pythia-tiny"
        assert sent[0]["lstar"]["alerts"][0]["threshold"] == pytest.approx(0.30)
        resolved = sent[1]["lstar"]["alerts"][0]
        assert resolved["state"] == "clear" and resolved["threshold"] == pytest.approx(0.50)
        fired_lo, fired_hi = sent[0]["lstar"]["alerts"][0]["interval"]
        assert fired_lo <= 0.30 <= fired_hi and resolved["interval"][1] < 0.50   # reaches 0.3, below 0.5
    # Each output the guide shows is what its command printed: the last run of it the guide's
    # tested blocks hold above the output shown (a command the guide runs more than once, as
    # `lstar run` in steps 5, 6 and 8, is checked against the run each block describes).
    printed = outputs(proc.stdout, proc.stderr)
    text = GUIDE.read_text()
    for command, lines, where in expectations_at(text):
        before = sum(1 for line in commands_above(text, where)
                     if line == command or line.startswith(command + " "))
        shown = [out for ran, out in printed if ran == command or ran.startswith(command + " ")][:before]
        assert shown, f"the guide shows the output of {command!r}, which its tested blocks never run"
        for line in lines:
            assert squeeze(line) in squeeze(shown[-1]), f"{command}: {line!r} not in\n{shown[-1][-3000:]}"
    # The file receiver got every alert (the at-risk one included), as the guide's policy says.
    filed = [json.loads(line) for line in (work / "state" / "alerts.jsonl").read_text().splitlines()]
    states = [a.get("labels", {}).get("state") for entry in filed for a in entry.get("message", {}).get("alerts", [])]
    assert "at_risk" in states, filed
    # ... and the resolve of step 6's policy change.
    resolves = [entry["message"] for entry in filed if entry.get("message", {}).get("status") == "resolved"]
    assert [a["labels"]["state"] for m in resolves for a in m["alerts"]] == ["at_risk"], filed
    ran = [line for line in proc.stdout.splitlines() if line.startswith("$ lstar ")]
    # The daemon downloads without huggingface_hub's progress bars ("Fetching 1 files").
    daemon_err = proc.stderr.split("$ lstar run ", 1)[1].split("\n$ ", 1)[0]
    assert "Fetching" not in daemon_err and "it/s]" not in daemon_err, daemon_err[-2000:]
    assert len(ran) == proc.stderr.count("exit 0") and len(ran) >= 25
    # The three watcher runs scored on one lent pool, whose worker template imported torch once.
    assert "scoring templates started: 1\n" in proc.stderr, proc.stderr[-2000:]
    # What the commands left is what the guide says they leave.
    with Store.open(work / "state" / "lstar.duckdb", read_only=True) as store:
        repos = {r["model_repo"] for r in store.query("SELECT DISTINCT model_repo FROM score_runs")}
        statuses = {r.status for r in store.list_checkpoints(repo="demo-org/pythia-tiny")}
        labels = store.query("SELECT count(*) AS n FROM labels")[0]["n"]
        changes = store.query("SELECT policy, task, reevaluated, resolved, fired FROM policy_changes")
    # step 6: the margin edit was applied once, at the next start, and resolved the one alert
    assert [(c["policy"], c["task"], c["reevaluated"], c["resolved"], c["fired"]) for c in changes] \
        == [("watch", "cloze", 1, 1, 0)]
    assert repos == {"demo-org/neox-ref", "demo-org/llama-ref", "demo-org/pythia-tiny",
                     "tune-org/pythia-tiny-chat", "tune-org/pythia-tiny-lora"}   # step 8: the derivatives
    assert statuses == {"scored"} and labels >= 6
    curve = json.loads((work / "policies" / "curves" / "cloze.json").read_text())
    assert curve["task"] == "cloze-v0" and sorted(curve["families"]) == ["llama", "neox"]
    assert (work / "reports" / "watch.html").stat().st_size > 10_000
