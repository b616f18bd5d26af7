"""`lstar calibrate`: the example campaign over six tiny checkpoints, killed twice and resumed,
its curves checked against an independent score and evaluation and accepted by `policy check`;
imported results; bad campaign files."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from monitor.cli import main
from monitor.curves import curve_warnings, load_curve
from monitor.escape import markdown_text
from monitor.scoring import ScoreRequest, load_corpus, score_checkpoint
from monitor.store import Store

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "calibrate" / "campaign.yaml"
NAMES = ("llama-a", "llama-b", "llama-c", "neox-a", "neox-b", "neox-c")


def _runs(db: Path) -> tuple[set[str], set[str]]:
    """Ids of the stored score runs and evaluation runs."""
    with Store.open(db, read_only=True) as store:
        scores = {r.run_id for r in store.score_runs(limit=1000)}
        evals = {r.run_id for r in store.eval_runs(limit=1000)}
    return scores, evals


def _calibrate_killed(campaign: Path, after_jobs: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LSTAR_FAILPOINT": f"calibrate_after_jobs={after_jobs}"}
    return subprocess.run([sys.executable, "-m", "monitor.cli", "calibrate", str(campaign), "--quiet"],
                          env=env, capture_output=True, text=True, timeout=900)


def run_json(capsys: Any, *argv: str) -> tuple[int, Any, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code == 0 and "--json" in argv else captured.out, captured.err


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory, shared_dir: Path) -> dict[str, Path]:
    """The example campaign as checked in, in a checkout-like folder beside ../shared, with
    the six checkpoints it names built by the lab's tiny-model builder."""
    from monitor.lab.tiny_models import build_calibration_checkpoints

    root = tmp_path_factory.mktemp("calib")
    (root / "shared").symlink_to(shared_dir)
    folder = root / "repo" / "examples" / "calibrate"
    folder.mkdir(parents=True)
    campaign = folder / "campaign.yaml"
    shutil.copyfile(EXAMPLE, campaign)
    build_calibration_checkpoints(folder / "models", shared_dir / "tokenizers")
    return {"campaign": campaign, "folder": folder, "out": folder / "out" / "tiny-cloze",
            "db": folder / "out" / "tiny-cloze" / "calibrate.duckdb"}


@pytest.fixture(scope="module")
def killed_and_resumed(layout: dict[str, Path]) -> dict[str, Any]:
    """Kill the campaign after 3 jobs (mid-scoring), then after 5 more (3 scores, 2
    evaluations), then let it finish; record the stored runs after each stage."""
    first = _calibrate_killed(layout["campaign"], 3)
    after_first = _runs(layout["db"])
    second = _calibrate_killed(layout["campaign"], 5)
    after_second = _runs(layout["db"])
    code = main(["calibrate", str(layout["campaign"]), "--json", "--quiet"])
    return {"first": first, "second": second, "after_first": after_first, "after_second": after_second,
            "final_code": code, "final": _runs(layout["db"])}


@pytest.mark.slow
def test_a_killed_campaign_resumes_without_redoing_finished_jobs(killed_and_resumed: dict[str, Any]) -> None:
    k = killed_and_resumed
    assert k["first"].returncode == -9, k["first"].stderr[-2000:]
    assert k["second"].returncode == -9, k["second"].stderr[-2000:]
    (s1, e1), (s2, e2), (s3, e3) = k["after_first"], k["after_second"], k["final"]
    assert (len(s1), len(e1)) == (3, 0)
    # The second run scored only the other three and evaluated two; the first three stay.
    assert len(s2) == 6 and s1 < s2 and len(e2) == 2
    assert k["final_code"] == 0
    # The last run scored nothing and evaluated only the four left: no run twice.
    assert s3 == s2 and len(e3) == 6 and e2 < e3


@pytest.mark.slow
def test_the_curves_hold_an_independent_score_and_evaluation(killed_and_resumed: dict[str, Any],
                                                             layout: dict[str, Path], shared_dir: Path) -> None:
    from monitor.curves import evaluate_checkpoint

    assert killed_and_resumed["final_code"] == 0
    curves = {p.name: load_curve(p) for p in sorted((layout["out"] / "curves").glob("*.json"))}
    assert set(curves) == {"cloze-v0.acc.json", "cloze-v0.prob_correct.json"}
    corpus = load_corpus(shared_dir / "corpus" / "calib-v0").select(every=36)
    model = layout["folder"] / "models" / "neox-b"
    # `lstar score` of one checkpoint, outside the campaign, with the campaign's settings.
    scored = score_checkpoint(ScoreRequest(model=str(model), corpus_dir=shared_dir / "corpus" / "calib-v0",
                                           every=36, max_context=128, dtype="float32", device="cpu",
                                           with_tcb=False, progress=False), db_path=None)
    evaluation = evaluate_checkpoint(str(model), shared_dir / "tasks" / "cloze-v0.jsonl", limit=16,
                                     dtype="float32", device="cpu")
    for name, curve in curves.items():
        assert curve.corpus_sha256 == corpus.sha256
        assert curve.scoring_spec is not None and curve.scoring_spec.describe() == \
            "lstar-score/1:window=128,stride=64,prefix=bos"
        assert curve.families == ["llama", "neox"] and curve.n_checkpoints == 6
        points = {p.checkpoint: p for p in curve.points}
        assert sorted(points) == sorted(NAMES)
        assert {p.family for n, p in points.items() if n.startswith("neox")} == {"neox"}
        point = points["neox-b"]
        assert math.isclose(point.x, scored["lstar"], rel_tol=0, abs_tol=1e-12)
        assert point.value == pytest.approx(evaluation.result.metrics[curve.metric][0], abs=1e-12)
        assert curve.baseline == pytest.approx(0.25) and curve.margin == 0.05
        assert curve.lofo is not None and curve.bootstrap.resamples == 200


@pytest.mark.slow
def test_the_report_carries_the_lofo_table_and_the_curves_warnings(killed_and_resumed: dict[str, Any],
                                                                    layout: dict[str, Path]) -> None:
    assert killed_and_resumed["final_code"] == 0
    report = json.loads((layout["out"] / "validation.json").read_text())
    markdown = (layout["out"] / "validation.md").read_text()
    assert len(report["curves"]) == 2
    for entry in report["curves"]:
        curve = load_curve(entry["path"])
        assert entry["summary"]["curve_id"] == curve.curve_id
        # The report's LOFO table is `curves validate`'s with the fit's seed and resamples:
        # the same rows the artifact stores.
        assert entry["lofo"]["rows"] == [r.model_dump() for r in curve.lofo.rows]
        assert [w["message"] for w in entry["warnings"]] == [w.message for w in curve_warnings(curve)]
        resolved = not any(w.unresolved for w in curve_warnings(curve))
        assert entry["summary"]["threshold_resolved"] is resolved
        assert f"## cloze-v0 · {curve.metric}" in markdown
        for w in curve_warnings(curve):   # each message as literal Markdown text
            assert markdown_text(w.message) in markdown
    assert "| L* |" in markdown and "| raw CE |" in markdown
    # The axis table: every score axis raced against L* on the same folds, one recommended.
    for entry in report["curves"]:
        choice = entry["axis_choice"]
        assert choice["reference"] == "lstar" and choice["recommended"] in {r["axis"] for r in choice["axes"]}
        assert {r["axis"] for r in choice["axes"] if r["available"]} >= {"lstar", "bits_per_byte", "raw_ce"}
        assert choice["rule"] in markdown.replace("\n", " ")
    assert "Progress axis, by leave-one-family-out evidence:" in markdown


@pytest.mark.slow
def test_the_written_curves_pass_policy_check(killed_and_resumed: dict[str, Any], layout: dict[str, Path],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert killed_and_resumed["final_code"] == 0
    curve = load_curve(layout["out"] / "curves" / "cloze-v0.acc.json")
    policy = layout["out"] / "policy.yaml"
    policy.write_text(f"""\
name: tiny-cloze
corpora: {{public: {curve.corpus_sha256}}}
tasks:
  - {{name: cloze-acc, curve: curves/cloze-v0.acc.json, confidence: 0.9}}
  - {{name: cloze-prob, curve: curves/cloze-v0.prob_correct.json}}
route: {{receiver: log}}
receivers:
  - {{name: log, file: {{path: alerts.jsonl}}}}
""")
    code = main(["policy", "check", str(policy)])
    out = capsys.readouterr().out
    assert code == 0 and out.strip() == f"SUCCESS {policy}"


@pytest.mark.slow
def test_a_finished_campaign_reruns_nothing_and_refits_the_same_curves(
        killed_and_resumed: dict[str, Any], layout: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert killed_and_resumed["final_code"] == 0
    before = {p.name: load_curve(p).curve_id for p in (layout["out"] / "curves").glob("cloze-v0.*.json")}
    code, summary, _ = run_json(capsys, "calibrate", str(layout["campaign"]), "--json", "--quiet")
    assert code == 0
    assert summary["scored"] == [] and summary["evaluated"] == [] and summary["failures"] == []
    assert {Path(c["path"]).name: c["curve_id"] for c in summary["curves"]} == before
    assert _runs(layout["db"]) == killed_and_resumed["final"]


def _results_file(folder: Path, repo: str, sha: str, acc: float, task: str = "toy_mc") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results_2026-01-01T00-00-00.json").write_text(json.dumps({
        "results": {task: {"acc,none": acc, "acc_stderr,none": 0.02}},
        "n-samples": {task: {"original": 500, "effective": 500}},
        "model_name": repo, "config": {"model_sha": sha}}))


@pytest.mark.slow
def test_imported_results_join_the_campaigns_scores(killed_and_resumed: dict[str, Any], layout: dict[str, Path],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A results task added to the finished campaign: only the import runs, and the curve's
    points are the files' values at the campaign's own L*."""
    assert killed_and_resumed["final_code"] == 0
    with Store.open(layout["db"], read_only=True) as store:
        runs = {Path(r.model_repo).name: r for r in store.score_runs(limit=100)}
    values = {}
    for name, run in runs.items():
        # Accuracy rising as L* falls, so the curve crosses inside the data.
        values[name] = round(0.25 + 0.5 / (1.0 + math.exp(4.0 * (run.lstar - 6.0))), 6)
        _results_file(layout["folder"] / "results" / name, run.model_repo, run.model_sha, values[name])
    _results_file(layout["folder"] / "results" / "stranger", "org/other", "f" * 40, 0.5)
    campaign = layout["folder"] / "with-results.yaml"
    campaign.write_text(EXAMPLE.read_text().replace(
        "tasks:\n", "tasks:\n  - {results: results, baseline: 0.25, metrics: [acc]}\n"))
    code, summary, _ = run_json(capsys, "calibrate", str(campaign), "--json", "--quiet")
    assert code == 0, summary
    assert summary["scored"] == [] and summary["evaluated"] == []
    assert summary["imported_labels"] == 6
    assert summary["skipped_results"] == [f"org/other@ffffffffffff (toy_mc/acc) in "
                                          f"{layout['folder'] / 'results' / 'stranger'}/results_2026-01-01T00-00-00.json"
                                          ": no campaign checkpoint has this repo or name"]
    curve = load_curve(layout["out"] / "curves" / "toy_mc.acc.json")
    assert {p.checkpoint: (p.x, p.value) for p in curve.points} == \
        {name: (runs[name].lstar, values[name]) for name in NAMES}
    assert curve.families == ["llama", "neox"]

    # The results are what the files say now: an edited value replaces the old one, and a
    # results file removed takes its label with it.
    edited, removed = NAMES[0], NAMES[1]
    run = runs[edited]
    _results_file(layout["folder"] / "results" / edited, run.model_repo, run.model_sha, 0.7)
    shutil.rmtree(layout["folder"] / "results" / removed)
    code, summary, _ = run_json(capsys, "calibrate", str(campaign), "--json", "--quiet")
    assert code == 0, summary
    curve = load_curve(layout["out"] / "curves" / "toy_mc.acc.json")
    expected = {name: (runs[name].lstar, values[name]) for name in NAMES if name != removed}
    assert {p.checkpoint: (p.x, p.value) for p in curve.points} == {**expected, edited: (run.lstar, 0.7)}
    with Store.open(layout["db"], read_only=True) as store:
        imported = [r for r in store.labels(task="toy_mc") if r.eval_run_id is None]
    assert sorted(r.checkpoint for r in imported) == sorted(n for n in NAMES if n != removed)


@pytest.mark.slow
def test_two_curves_for_one_file_are_neither_written_and_only_this_campaigns_stale_curves_go(
        killed_and_resumed: dict[str, Any], layout: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Two results entries that both define toy_mc would write one curves/toy_mc.acc.json: the
    run refuses both and says so. The toy_mc curve an earlier run of this campaign wrote, and
    this one did not, is removed and named, so a policy cannot go on reading it; a curve placed
    by hand and one edited since the campaign wrote it stay, each with the reason."""
    assert killed_and_resumed["final_code"] == 0
    with Store.open(layout["db"], read_only=True) as store:
        runs = {Path(r.model_repo).name: r for r in store.score_runs(limit=100)}
    for folder, task in (("twice-a", "toy_mc"), ("twice-b", "toy_mc"), ("other", "toy_other")):
        for name, run in runs.items():
            rising = round(0.25 + 0.5 / (1.0 + math.exp(4.0 * (run.lstar - 6.0))), 6)
            _results_file(layout["folder"] / folder / name, run.model_repo, run.model_sha, rising, task)
    curves = layout["out"] / "curves"
    campaign = layout["folder"] / "twice.yaml"
    campaign.write_text(EXAMPLE.read_text().replace(
        "tasks:\n", "tasks:\n  - {results: twice-a, baseline: 0.25, metrics: [acc]}\n"
                    "  - {results: other, baseline: 0.25, metrics: [acc]}\n"))
    code, summary, _ = run_json(capsys, "calibrate", str(campaign), "--json", "--quiet")
    assert code == 0, summary
    stale, edited = curves / "toy_mc.acc.json", curves / "toy_other.acc.json"
    assert stale.is_file() and edited.is_file()
    edited.write_text(edited.read_text() + "\n")
    hand = curves / "hand.acc.json"
    shutil.copyfile(curves / "cloze-v0.acc.json", hand)

    campaign.write_text(EXAMPLE.read_text().replace(
        "tasks:\n", "tasks:\n  - {results: twice-a, baseline: 0.25, metrics: [acc]}\n"
                    "  - {results: twice-b, baseline: 0.25, metrics: [acc]}\n"))
    code, out, err = run_json(capsys, "calibrate", str(campaign), "--json", "--quiet")
    assert code == 2 and "could not be fitted" in err
    summary = json.loads(out)   # printed before the error
    errors = [c["error"] for c in summary["curves"] if c["task"] == "toy_mc"]
    assert errors == ["toy_mc · acc and toy_mc · acc would both be written to curves/toy_mc.acc.json; "
                      "rename one of the tasks"] * 2
    assert summary["removed"] == [str(stale)] and not stale.exists()
    kept = {Path(k["path"]).name: k["reason"] for k in summary["kept"]}
    assert kept["toy_other.acc.json"] == "changed since this campaign wrote it" and edited.is_file()
    assert kept["hand.acc.json"].startswith("not written by campaign tiny-cloze") and hand.is_file()
    assert (curves / "cloze-v0.acc.json").is_file()   # the rest is written

    # The table output names what it kept, and why.
    code = main(["calibrate", str(campaign), "--quiet"])
    printed = capsys.readouterr().out
    assert code == 2
    assert f"kept {hand}: not written by campaign tiny-cloze ({campaign}) (not in its record " \
           "calibrate-manifest.json)" in printed.splitlines()
    hand.unlink()
    edited.unlink()


def test_imported_labels_match_one_checkpoint_or_are_skipped_with_why() -> None:
    """A label without a sha (lm-eval results that record only a branch) is not pinned to the
    first checkpoint of its repo: with several of that repo it is skipped and says why."""
    from monitor.calibrate.plan import CheckpointRef
    from monitor.calibrate.runner import _match_checkpoint
    from monitor.curves.labels import Label

    def ref(name: str, sha: str, repo: str = "EleutherAI/pythia-70m") -> CheckpointRef:
        return CheckpointRef(index=0, name=name, family="pythia", ref=f"{repo}@{sha}", repo=repo, sha=sha,
                             source="hub", local_dir=None)

    a, b = ref("p-step1000", "a" * 40), ref("p-step2000", "ab" + "c" * 38)
    one = [ref("solo", "d" * 40, repo="org/solo")]
    by_branch = Label(checkpoint="EleutherAI/pythia-70m@step2000", value=0.55, repo="EleutherAI/pythia-70m")
    found, why = _match_checkpoint(by_branch, [a, b])
    assert found is None and "2 checkpoints of EleutherAI/pythia-70m (p-step1000, p-step2000)" in why
    assert _match_checkpoint(by_branch.with_(checkpoint="p-step2000"), [a, b])[0] is b      # named
    assert _match_checkpoint(by_branch.with_(sha="ab" + "c" * 38), [a, b])[0] is b           # full sha
    assert _match_checkpoint(by_branch.with_(sha="abcccccc"), [a, b])[0] is b                 # prefix
    assert _match_checkpoint(by_branch.with_(sha="a"), [a, b])[0] is None                     # too short
    assert "not one of the campaign's" in _match_checkpoint(by_branch.with_(sha="e" * 40), [a, b])[1]
    solo = Label(checkpoint="org/solo@main", value=0.5, repo="org/solo")
    assert _match_checkpoint(solo, one)[0] is one[0]                                           # the only one


LM_TASK = """\
task: toy_cloze
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
target_delimiter: ""
metric_list:
  - {{metric: acc, aggregation: mean, higher_is_better: true}}
"""


def _naive_lm_eval_acc(model_dir: Path, items: list[dict[str, Any]]) -> float:
    """Accuracy as lm-evaluation-harness computes it for a causal model: per option, the summed
    log-probabilities of its tokens after the context, no prefix token; one forward pass each."""
    import torch
    from transformers import AutoModelForCausalLM

    from monitor.curves.evaluator import encode_pair
    from monitor.scoring import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    tokenizer = load_tokenizer(model_dir).tokenizer
    correct = 0
    for item in items:
        scores = []
        for choice in item["choices"]:
            ctx, cont = encode_pair(tokenizer, item["context"], choice)
            ids = ctx + cont
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)
            scores.append(sum(float(logp[len(ctx) - 1 + i, t]) for i, t in enumerate(cont)))
        correct += int(max(range(len(scores)), key=scores.__getitem__) == item["answer"])
    return correct / len(items)


@pytest.mark.slow
def test_an_lm_eval_task_runs_on_the_loaded_checkpoints(killed_and_resumed: dict[str, Any], layout: dict[str, Path],
                                                        shared_dir: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """An lm-eval task of one's own (`include`) added to the finished campaign: only its six
    evaluations run, and each checkpoint's accuracy is what the harness's rule gives by hand."""
    pytest.importorskip("lm_eval")
    assert killed_and_resumed["final_code"] == 0
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    lines = (shared_dir / "tasks" / "cloze-v0.jsonl").read_text().splitlines()[:8]
    tasks = tmp_path / "lm_tasks"
    tasks.mkdir()
    (tasks / "toy.jsonl").write_text("\n".join(lines) + "\n")
    (tasks / "toy_cloze.yaml").write_text(LM_TASK.format(data=tasks / "toy.jsonl"))
    campaign = layout["folder"] / "with-lm-eval.yaml"
    campaign.write_text(EXAMPLE.read_text().replace(
        "tasks:\n", f"tasks:\n  - {{lm_eval: toy_cloze, include: {tasks}, baseline: 0.25, metrics: [acc]}}\n"))
    code, summary, _ = run_json(capsys, "calibrate", str(campaign), "--json", "--quiet")
    assert code == 0, summary
    assert summary["scored"] == [] and len(summary["evaluated"]) == 6
    items = [json.loads(line) for line in lines]
    expected = {name: _naive_lm_eval_acc(layout["folder"] / "models" / name, items) for name in NAMES}
    with Store.open(layout["db"], read_only=True) as store:
        stored = {Path(r.repo).name: r.value for r in store.labels(task="toy_cloze", metric="acc")}
    assert stored == expected
    curve = load_curve(layout["out"] / "curves" / "toy_cloze.acc.json")
    assert {p.checkpoint: p.value for p in curve.points} == expected


# -- bad campaign files: one line naming the file, the line and the key -------------------------
GOOD = """\
name: c
corpus: {{dir: {corpus}}}
checkpoints:
  - {{ref: {model}, family: a}}
  - {{ref: org/model@{sha}, family: b}}
tasks:
  - {{builtin: {task}}}
fit: {{margin: 0.1}}
output: out
"""


def _model_folder(tmp_path: Path) -> Path:
    """A folder the campaign's checks take for a checkpoint (it holds a config.json)."""
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text("{}")
    return folder


@pytest.mark.parametrize("edit, where, fragment", [
    (("  - {ref: org/model@" + "a" * 40, "  - {ref: org/model@main"), ":5: checkpoints[1].ref:",
     "'org/model@main' is not pinned; write org/model@<40-hex commit sha>"),
    (("fit: {margin: 0.1}", "fit: {margin: 0.1, n_bot: 5}"), ":8: fit.n_bot:", "did you mean 'n_boot'?"),
    (("fit: {margin: 0.1}", "fit: {margin: -1}"), ":8: fit.margin:", "greater than 0"),
    (("fit: {margin: 0.1}", "fit: {}"), ":8: fit.margin:", "missing"),
    (("  - {builtin: ", "  - {lm_eval: x, builtin: "), ":7: tasks[0]:", "exactly one of builtin, lm_eval or results"),
    (("output: out\n", "output: out\nscoring: {backend: local, ray_address: x}\n"), ":10: scoring:",
     "ray_address is set but backend is not 'ray'"),
    (("family: b}", "family: a}"), ":3: checkpoints:", "at least 2 families"),
    (("corpus: {dir: ", "corpus: {dir: /nonexistent"), ":2: corpus.dir:", "no corpus at"),
    (("  - {ref: /", "  - {ref: /nonexistent"), ":4: checkpoints[0].ref:", "no folder"),
    (("tasks:\n", "tasks:\n  - {results: r.json}\n"), ":7: tasks[0].results:", "no results file or folder 'r.json'"),
    (("name: c\n", "name: c\nname: d\n"), ":2: name:", "duplicate key"),
    (("name: c\n", "name: !!python/object:os.system c\n"), ":1: name:", "tag '!!python/object:os.system' is not allowed"),
    (("org/model@", "org/..@"), ":5: checkpoints[1].ref:", "'org/..' is not a Hub repo id"),
    (("org/model@", "org/-model@"), ":5: checkpoints[1].ref:", "'org/-model' is not a Hub repo id"),
    (("output: out\n", "output: out\nhub: {endpoint: not a url}\n"), ":10: hub.endpoint:",
     "'not a url' is not an http(s) URL"),
    (("output: out\n", "output: /tmp/elsewhere\n"), ":9: output:", "must be a folder inside the campaign file's folder"),
    (("output: out\n", "output: ../out\n"), ":9: output:", "must be a folder inside the campaign file's folder"),
    (("output: out\n", "output: ~/.ssh\n"), ":9: output:", "must be a folder inside the campaign file's folder"),
    (("output: out\n", "output: ''\n"), ":9: output:", "must be a folder inside the campaign file's folder"),
    (("output: out\n", "output: campaign.yaml\n"), ":9: output:", "exists and is not a folder"),
])
def test_bad_campaign_files_give_one_line_naming_file_line_and_key(
        edit: tuple[str, str], where: str, fragment: str, tmp_path: Path, shared_dir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    text = GOOD.format(corpus=shared_dir / "corpus" / "calib-v0", model=_model_folder(tmp_path), sha="a" * 40,
                       task=shared_dir / "tasks" / "cloze-v0.jsonl")
    assert edit[0] in text
    path = tmp_path / "campaign.yaml"
    path.write_text(text.replace(edit[0], edit[1], 1))
    code = main(["calibrate", str(path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"error: {path}{where}") and err.count("\n") == 1, err
    assert fragment in err, err
    assert not (tmp_path / "out").exists()


def test_a_folder_without_config_and_a_task_file_that_is_no_task_are_found_before_any_work(
        tmp_path: Path, shared_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = GOOD.format(corpus=shared_dir / "corpus" / "calib-v0", model=_model_folder(tmp_path), sha="a" * 40,
                       task=shared_dir / "tasks" / "cloze-v0.jsonl")
    path = tmp_path / "campaign.yaml"
    bare = tmp_path / "bare"
    bare.mkdir()
    path.write_text(text.replace(str(tmp_path / "model"), str(bare), 1))
    assert main(["calibrate", str(path)]) == 2
    assert capsys.readouterr().err.startswith(
        f"error: {path}:4: checkpoints[0].ref: folder '{bare}' is not a checkpoint (no config.json in it)")
    notask = tmp_path / "notask.jsonl"
    notask.write_text('{"id": "a", "context": "x"}\n')
    path.write_text(text.replace(str(shared_dir / "tasks" / "cloze-v0.jsonl"), str(notask), 1))
    assert main(["calibrate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}:7: tasks[0].builtin: task file '{notask}' is not a multiple-choice task: "
                          f"{notask}:1: missing 'choices'"), err
    assert not (tmp_path / "out").exists()


def test_the_command_line_may_write_a_campaign_anywhere(tmp_path: Path, shared_dir: Path) -> None:
    """A campaign file writes inside its own folder; `--output` is the caller's choice."""
    from monitor.calibrate import load_campaign

    text = GOOD.format(corpus=shared_dir / "corpus" / "calib-v0", model=_model_folder(tmp_path), sha="a" * 40,
                       task=shared_dir / "tasks" / "cloze-v0.jsonl")
    path = tmp_path / "campaign.yaml"
    path.write_text(text)
    assert load_campaign(path).output_dir == tmp_path / "out"
    elsewhere = tmp_path / "elsewhere" / "results"
    assert load_campaign(path, output=elsewhere).output_dir == elsewhere
    path.write_text(text.replace("output: out", "output: /somewhere/else"))
    assert load_campaign(path, output=elsewhere).output_dir == elsewhere


def test_missing_or_empty_campaign_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", str(tmp_path / "none.yaml")]) == 2
    assert capsys.readouterr().err == f"error: no campaign file at {tmp_path / 'none.yaml'}; pass the path of a campaign YAML file\n"
    broken = tmp_path / "broken.yaml"
    broken.symlink_to(tmp_path / "gone.yaml")
    assert main(["calibrate", str(broken)]) == 2
    assert capsys.readouterr().err == (f"error: {broken}: is a symbolic link to {tmp_path / 'gone.yaml'}, which "
                                       "does not exist; pass the path of a campaign YAML file\n")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert main(["calibrate", str(empty)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {empty}:1: the file is empty")


@pytest.mark.parametrize("kind, what", [("fifo", "a named pipe (FIFO)"), ("dir", "a directory"),
                                        ("zero", "a character device")])
def test_a_campaign_path_that_is_no_regular_file_says_what_it_is(
        kind: str, what: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Named as what it is, at once: a FIFO with no writer is opened without blocking."""
    import threading

    path = tmp_path / "campaign.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")
    codes: list[int] = []
    worker = threading.Thread(target=lambda: codes.append(main(["calibrate", str(path)])), daemon=True)
    worker.start()
    worker.join(60)   # generous: a blocked open would never return
    assert codes == [2], "lstar calibrate blocked on the campaign path"
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: is {what}, not a campaign file; campaign files are regular YAML files")
    assert err.count("\n") == 1


@pytest.mark.parametrize("link", ["out", "deep/out"])
def test_an_output_folder_linked_out_of_the_campaign_folder_is_refused_with_nothing_written(
        link: str, tmp_path: Path, shared_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`output: out` where out (or a folder above it) is a symbolic link leading elsewhere."""
    from monitor.calibrate import load_campaign

    folder = tmp_path / "campaign"
    folder.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    text = GOOD.format(corpus=shared_dir / "corpus" / "calib-v0", model=_model_folder(tmp_path), sha="a" * 40,
                       task=shared_dir / "tasks" / "cloze-v0.jsonl").replace("output: out", f"output: {link}")
    path = folder / "campaign.yaml"
    path.write_text(text)
    (folder / link.split("/")[0]).symlink_to(elsewhere)
    code = main(["calibrate", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    real = elsewhere / "out" if link == "deep/out" else elsewhere
    assert err.startswith(f"error: {path}:9: output: output {link!r} leads to {real} through a symbolic link, "
                          "outside the campaign file's folder"), err
    assert list(elsewhere.iterdir()) == []
    # A link that stays inside the folder is followed, and the run writes to its real place.
    (folder / link.split("/")[0]).unlink()
    (folder / "real").mkdir()
    (folder / link.split("/")[0]).symlink_to(folder / "real")
    assert load_campaign(path).output_dir == folder / "real" / ("out" if link == "deep/out" else "")


def test_a_linked_curves_folder_in_the_output_is_refused_before_any_work(
        tmp_path: Path, shared_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Also with `--output`: the curves go into a real folder of the output, never through a link."""
    text = GOOD.format(corpus=shared_dir / "corpus" / "calib-v0", model=_model_folder(tmp_path), sha="a" * 40,
                       task=shared_dir / "tasks" / "cloze-v0.jsonl")
    path = tmp_path / "campaign.yaml"
    path.write_text(text)
    out, policies = tmp_path / "given", tmp_path / "policies"
    out.mkdir()
    policies.mkdir()
    (policies / "curve.json").write_text("{}")
    (out / "curves").symlink_to(policies)
    code = main(["calibrate", str(path), "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {path}:9: output: {out / 'curves'} is a symbolic link (to {policies})"), err
    assert sorted(p.name for p in out.iterdir()) == ["curves"]
    assert sorted(p.name for p in policies.iterdir()) == ["curve.json"]


def test_an_lm_eval_task_without_the_harness_names_the_task_and_the_install(
        tmp_path: Path, shared_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "lm_eval", None)   # import lm_eval raises ImportError
    text = GOOD.format(corpus=shared_dir / "corpus" / "calib-v0", model=_model_folder(tmp_path), sha="a" * 40,
                       task=shared_dir / "tasks" / "cloze-v0.jsonl")
    path = tmp_path / "campaign.yaml"
    path.write_text(text.replace("tasks:\n", "tasks:\n  - {lm_eval: arc_easy, baseline: 0.25}\n"))
    code = main(["calibrate", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert f"{path}: tasks[0]: lm_eval task 'arc_easy' needs lm-evaluation-harness" in err
    assert 'pip install -e ".[bench]"' in err
    assert not (tmp_path / "out").exists()


def test_a_ray_campaign_without_ray_says_how_to_install_it(
        tmp_path: Path, shared_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)   # find_spec("ray") is None: not installed
    text = GOOD.format(corpus=shared_dir / "corpus" / "calib-v0", model=_model_folder(tmp_path), sha="a" * 40,
                       task=shared_dir / "tasks" / "cloze-v0.jsonl")
    path = tmp_path / "campaign.yaml"
    path.write_text(text + "scoring: {backend: ray, ray_address: '127.0.0.1:6379'}\n")
    code = main(["calibrate", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert f"{path}: scoring.backend: 'ray' needs the ray package" in err and 'pip install -e ".[ray]"' in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_pinned_hub_checkpoint_joins_the_campaign(killed_and_resumed: dict[str, Any], layout: dict[str, Path],
                                                    tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Hub checkpoint (the fake Hub, pinned to its commit) added to the finished campaign:
    it alone is fetched, scored and evaluated, and its runs record the repo and the sha."""
    from monitor.demo.fakehub import FakeHub
    from monitor.demo.hub_repos import add_lineage

    assert killed_and_resumed["final_code"] == 0
    with FakeHub() as hub:
        sha = add_lineage(hub, "demo-org/neox-ref", steps=(1000,), build_dir=tmp_path / "build", seed=77)["step1000"]
        campaign = layout["folder"] / "with-hub.yaml"
        campaign.write_text(EXAMPLE.read_text().replace(
            "  - {ref: models/neox-c, family: neox}\n",
            f"  - {{ref: models/neox-c, family: neox}}\n  - {{ref: demo-org/neox-ref@{sha}, family: hub}}\n")
            + f"hub: {{endpoint: '{hub.url}', cache_dir: {tmp_path / 'cache'}}}\n")
        code, summary, _ = run_json(capsys, "calibrate", str(campaign), "--json", "--quiet")
    assert code == 0, summary
    assert len(summary["scored"]) == 1 and len(summary["evaluated"]) == 1
    with Store.open(layout["db"], read_only=True) as store:
        run = store.score_run(summary["scored"][0])
        evals = [r for r in store.eval_runs(limit=1000) if r.run_id == summary["evaluated"][0]]
    assert (run.model_repo, run.model_sha, run.model_source) == ("demo-org/neox-ref", sha, "hub")
    assert (evals[0].model_repo, evals[0].model_sha) == ("demo-org/neox-ref", sha)
    curve = load_curve(layout["out"] / "curves" / "cloze-v0.acc.json")
    points = {p.checkpoint: p for p in curve.points}
    assert points[f"demo-org/neox-ref@{sha[:12]}"].x == run.lstar and curve.families == ["hub", "llama", "neox"]


@pytest.mark.slow
def test_a_broken_checkpoint_fails_its_jobs_and_keeps_the_rest(killed_and_resumed: dict[str, Any],
                                                               layout: dict[str, Path],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint whose weights are cut short: its score and evaluation fail with the reason,
    the command exits non-zero before fitting, and what was stored stays as it was."""
    assert killed_and_resumed["final_code"] == 0
    broken = layout["folder"] / "models" / "broken"
    shutil.copytree(layout["folder"] / "models" / "llama-a", broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])
    before = _runs(layout["db"])
    curves = {p.name: p.read_bytes() for p in (layout["out"] / "curves").glob("*.json")}
    campaign = layout["folder"] / "with-broken.yaml"
    campaign.write_text(EXAMPLE.read_text().replace(
        "  - {ref: models/neox-c, family: neox}\n",
        "  - {ref: models/neox-c, family: neox}\n  - {ref: models/broken, family: llama}\n"))
    code = main(["calibrate", str(campaign), "--quiet"])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("error: 2 job(s) of campaign tiny-cloze failed; no curves were fitted") and err.count("\n") == 1
    failed = [line for line in out.splitlines() if line.startswith("failed ")]
    assert [line.split(":")[0] for line in failed] == ["failed score broken (models/broken)",
                                                       "failed eval broken (models/broken) · cloze-v0"]
    assert all("safetensors" in line for line in failed), failed
    assert _runs(layout["db"]) == before
    assert {p.name: p.read_bytes() for p in (layout["out"] / "curves").glob("*.json")} == curves


@pytest.mark.slow
def test_a_checkpoint_added_to_a_campaign_on_ray_is_scored_on_the_cluster(
        killed_and_resumed: dict[str, Any], layout: dict[str, Path], shared_dir: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The same campaign with `backend: ray` (a local Ray instance the run starts): only the
    new checkpoint's score runs, through the Ray backend, and equals the in-process score."""
    pytest.importorskip("ray")
    from monitor.lab.tiny_models import build_tiny_model

    assert killed_and_resumed["final_code"] == 0
    model = build_tiny_model(layout["folder"] / "models" / "neox-d", shared_dir / "tokenizers" / "gpt-neox",
                             arch="gpt_neox", seed=9, init_std=0.25)
    campaign = layout["folder"] / "with-ray.yaml"
    campaign.write_text(EXAMPLE.read_text().replace("  backend: local\n", "  backend: ray\n").replace(
        "  - {ref: models/neox-c, family: neox}\n", "  - {ref: models/neox-c, family: neox}\n"
                                                     "  - {ref: models/neox-d, family: neox}\n"))
    try:
        code, summary, _ = run_json(capsys, "calibrate", str(campaign), "--json", "--quiet")
    finally:
        import ray

        ray.shutdown()
    assert code == 0, summary
    assert len(summary["scored"]) == 1 and len(summary["evaluated"]) == 1
    with Store.open(layout["db"], read_only=True) as store:
        run = store.score_run(summary["scored"][0])
    scored = score_checkpoint(ScoreRequest(model=str(model), corpus_dir=shared_dir / "corpus" / "calib-v0",
                                           every=36, max_context=128, dtype="float32", device="cpu",
                                           with_tcb=False, progress=False), db_path=None)
    assert abs(run.lstar - scored["lstar"]) <= 1e-12


def test_a_fifo_put_in_place_of_a_builtin_task_is_an_error_not_a_hang(tmp_path: Path, shared_dir: Path) -> None:
    import threading

    from monitor.calibrate import load_campaign
    from monitor.calibrate.plan import task_identity
    from monitor.errors import CampaignError

    task = tmp_path / "toy.jsonl"
    task.write_bytes((shared_dir / "tasks" / "cloze-v0.jsonl").read_bytes())
    path = tmp_path / "campaign.yaml"
    path.write_text(GOOD.format(corpus=shared_dir / "corpus" / "calib-v0", model=_model_folder(tmp_path),
                                sha="a" * 40, task=task))
    campaign = load_campaign(path)
    assert task_identity(campaign, campaign.tasks[0])[1] == hashlib.sha256(task.read_bytes()).hexdigest()
    task.unlink()
    os.mkfifo(task)   # swapped after the campaign was checked
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(r=_raised(task_identity, campaign, campaign.tasks[0])),
                              daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():   # the old code blocks in open(): give it a writer so the thread ends
        os.close(os.open(task, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("task_identity blocked on a FIFO")
    assert isinstance(out["r"], CampaignError)
    assert out["r"].message == f"{task}: is a named pipe (FIFO), not a multiple-choice task file"


def _raised(call, *args):
    try:
        return call(*args)
    except Exception as exc:  # noqa: BLE001 - handed to the test
        return exc
