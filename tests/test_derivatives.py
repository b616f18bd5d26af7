"""Derivatives judged on two coordinates (monitor.alerts.derivatives): `base` predicts from
L*(base) and flags ρ unmeasured, `residual` adds the mean residual of labelled pairs and widens
the interval by its uncertainty (checked against a hand computation), a derivative whose base
is still on the queue waits (reliability row 60), and reference bases are queued once and gated
like any checkpoint (row 61).
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from monitor.alerts import evaluate_pending
from monitor.alerts.reference_bases import add_reference_bases
from monitor.curves import load_curve, predict
from monitor.errors import PolicyError
from monitor.policy import load_policy
from monitor.reports.report import build_report, to_html, to_markdown
from monitor.store.listings import checkpoints_page
from monitor.store import Store
from support.cli_run import lstar_in_process
from support.scores import CALIB_V0_SHA256, fake_sha, record_fake_score

T0 = datetime(2025, 6, 1, 12, tzinfo=timezone.utc)
Z90 = 1.6448536269514722   # the two-sided normal quantile of the curve's 90 % band


def fit(path: Path) -> None:
    """A real curve on calib-v0 (window 128, stride 64): accuracy falls from 0.85 to 0.25 as L* rises."""
    from monitor.curves.artifact import ScoringRef, save_curve
    from monitor.curves.fit import fit_curve
    from monitor.curves.labels import Label

    xs = np.linspace(0.0, 3.0, 16)
    labels = [Label(checkpoint=f"h{i}", value=float(0.25 + 0.6 / (1 + np.exp(4 * (x - 1.2)))),
                    family="f1" if i % 2 else "f2", task="cloze", metric="acc", n=200, lstar=float(x))
              for i, x in enumerate(xs)]
    spec = ScoringRef(spec_version="lstar-score/1", window=128, stride=64, prefix_policy="bos")
    curve = fit_curve(labels, task="cloze", metric="acc", baseline=0.25, margin=0.05, confidence=0.9,
                      resamples=50, seed=0, lofo=False, corpus_sha256=CALIB_V0_SHA256, scoring_spec=spec,
                      grid_size=31, now=T0)
    save_curve(curve, path)


def write_policy(folder: Path, *, score_bases: bool = False, watch: str = "", name: str = "gov") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    fit(folder / "cloze.json")
    (folder / "gov.yaml").write_text(
        f"name: {name}\n{watch}lineage: {{score_bases: {str(score_bases).lower()}}}\ntasks:\n"
        "  - name: by-base\n    curve: cloze.json\n"
        "  - name: by-residual\n    curve: cloze.json\n    derivatives: residual\n"
        "route: {receiver: log, group_wait: 0s, group_interval: 0s}\n"
        f"receivers:\n  - name: log\n    file: {{path: {folder / 'alerts.jsonl'}}}\n")
    return folder / "gov.yaml"


def add_checkpoint(store: Store, repo: str, sha: str, *, status: str = "gated", rule: str | None = "r",
                   base: tuple[str, str] | None = None, relation: str = "finetune") -> int:
    """A Hub checkpoint row, gated with its lineage recorded the way the gate records it."""
    [(cid,)] = store.conn.execute(
        "INSERT INTO checkpoints (repo, sha, source, refs, lineage, rule, discovered_at, updated_at, status) "
        "VALUES (?, ?, 'hub', '[]', ?, ?, ?, ?, 'discovered') RETURNING id", [repo, sha, repo, rule, T0, T0]).fetchall()
    lineage = None if base is None else {"base_repo": base[0], "base_sha": base[1], "relation": relation,
                                         "relation_source": "declared", "bases": [base[0]], "problem": None}
    assert store.set_checkpoint_verdict(cid, expect_status="discovered", status=status, reason=None, meta={},
                                        now=T0, base=lineage)
    return cid


def label(store: Store, repo: str, sha: str, value: float, n: int = 400) -> None:
    store.record_labels([{"repo": repo, "sha": sha, "checkpoint": f"{repo}@{sha[:8]}", "task": "cloze",
                          "metric": "acc", "value": value, "n": n, "source": "csv", "source_ref": "pairs.csv"}])


def scored(store: Store, repo: str, sha: str, lstar: float, *, se: float = 0.02, hours: int = 0) -> None:
    record_fake_score(store, repo=repo, sha=sha, lstar=lstar, se=se, finished_at=T0 + timedelta(hours=hours))


def predictions(store: Store, repo: str) -> dict[str, dict]:
    rows = store.query("SELECT task, state, lstar, p_hat, lo, hi, detail FROM predictions WHERE repo = ?", [repo])
    return {r["task"]: {**r, "detail": json.loads(r["detail"])} for r in rows}


@pytest.fixture
def world(tmp_path):
    """Three bases, two labelled fine-tunes of the first two, and an unlabelled one of the third."""
    policy = load_policy(write_policy(tmp_path / "policies"))
    store = Store.open(tmp_path / "state" / "lstar.duckdb")
    shas = {name: fake_sha(name) for name in ("b1", "b2", "b3", "d1", "d2", "d3")}
    for i, (b, x) in enumerate((("b1", 0.9), ("b2", 1.3), ("b3", 1.1))):
        add_checkpoint(store, f"up/{b}", shas[b], rule=None)
        scored(store, f"up/{b}", shas[b], x, hours=i)
    for i, (d, b, x, obs) in enumerate((("d1", "b1", 0.8, 0.80), ("d2", "b2", 1.2, 0.72))):
        add_checkpoint(store, f"org/{d}", shas[d], base=(f"up/{b}", shas[b]))
        scored(store, f"org/{d}", shas[d], x, hours=3 + i)
        label(store, f"org/{d}", shas[d], obs)
    add_checkpoint(store, "org/d3", shas["d3"], base=("up/b3", shas["b3"]))
    scored(store, "org/d3", shas["d3"], 1.05, hours=6)
    yield policy, store, shas, tmp_path
    store.close()


def test_residual_mode_widens_the_interval_by_the_pairs_uncertainty(world) -> None:
    policy, store, shas, tmp_path = world
    evaluate_pending(store, [policy], now=T0 + timedelta(days=1))
    curve = load_curve(tmp_path / "policies" / "cloze.json")

    # By hand: ρ_i = observed − φ(L*(base_i)); ρ̄ their mean, s their standard deviation; the
    # band at L*(b3) (widened by b3's SE) shifted by ρ̄, each half-width widened in quadrature by
    # the predictive half-width t₁·s·√(1 + 1/2) of a new derivative's residual (t₁ at 90 %:
    # tan(0.45·π) = 6.3138, the Cauchy quantile).
    rhos = [0.80 - predict(curve, 0.9).p_hat, 0.72 - predict(curve, 1.3).p_hat]
    mean, sd = statistics.fmean(rhos), abs(rhos[0] - rhos[1]) / math.sqrt(2)
    se = sd / math.sqrt(2)
    half_width = math.tan(0.45 * math.pi) * sd * math.sqrt(1.5)
    at_b3 = predict(curve, 1.1, 0.02)
    p_hat = at_b3.p_hat + mean
    lo = p_hat - math.sqrt((at_b3.p_hat - at_b3.lower) ** 2 + half_width ** 2)
    hi = p_hat + math.sqrt((at_b3.upper - at_b3.p_hat) ** 2 + half_width ** 2)

    got = predictions(store, "org/d3")
    res = got["by-residual"]
    assert (res["p_hat"], res["lo"], res["hi"]) == pytest.approx((p_hat, lo, hi), abs=1e-12)
    assert res["hi"] - res["lo"] > at_b3.upper - at_b3.lower    # the residual's uncertainty is in it
    derivative = res["detail"]["derivative"]
    assert derivative["residual"]["n_pairs"] == 2
    assert (derivative["residual"]["mean"], derivative["residual"]["se"]) == pytest.approx((mean, se))
    assert derivative["residual"]["half_width"] == pytest.approx(half_width, rel=1e-9)
    assert (derivative["coordinate"], derivative["lstar_base"], derivative["lstar_own"]) == ("base", 1.1, 1.05)
    # The stored L* is the checkpoint's own; the value the curve read is its base's.
    assert res["lstar"] == 1.05 and res["detail"]["value"] == 1.1

    # `base` mode: exactly the curve at L*(base), ρ flagged unmeasured in the alert's labels.
    base = got["by-base"]
    assert (base["p_hat"], base["lo"], base["hi"]) == pytest.approx((at_b3.p_hat, at_b3.lower, at_b3.upper))
    assert base["state"] == at_b3.state
    own = predict(curve, 1.05, 0.02)
    assert base["detail"]["derivative"]["own"]["p_hat"] == pytest.approx(own.p_hat) != pytest.approx(at_b3.p_hat)
    assert base["detail"]["derivative"]["rho_measured"] is False
    assert any("ρ unmeasured" in c for c in base["detail"]["caveats"])
    alerts = store.query("SELECT task, labels, annotations FROM alerts WHERE repo = 'org/d3'")
    for a in alerts:
        labels = json.loads(a["labels"])
        assert (labels["coordinate"], labels["rho_measured"]) == ("base", "false")
        assert "state from L*(base) = 1.1000" in json.loads(a["annotations"])["coordinates"]

    # A labelled derivative's ρ is measured: observed − φ(L*(base)), its interval combining the
    # binomial SE of the observation with each side of the band at L*(base) (φ ∈ [lo, hi]: the
    # band's upper side bounds ρ from below).
    d1 = predictions(store, "org/d1")["by-base"]["detail"]["derivative"]
    at_b1 = predict(curve, 0.9, 0.02)
    h_obs = Z90 * math.sqrt(0.8 * 0.2 / 400)
    rho = 0.80 - at_b1.p_hat
    assert d1["rho_measured"] is True and d1["rho"]["rho"] == pytest.approx(rho)
    assert d1["rho"]["interval"] == pytest.approx([rho - math.hypot(at_b1.upper - at_b1.p_hat, h_obs),
                                                   rho + math.hypot(at_b1.p_hat - at_b1.lower, h_obs)])

    # A checkpoint without a base is predicted as before: from its own L*.
    plain = predictions(store, "up/b1")["by-base"]
    assert "derivative" not in plain["detail"] and plain["p_hat"] == pytest.approx(predict(curve, 0.9, 0.02).p_hat)


def test_residual_mode_refuses_with_fewer_than_two_pairs(world) -> None:
    policy, store, shas, _ = world
    store.conn.execute("DELETE FROM labels WHERE repo = 'org/d2'")
    evaluate_pending(store, [policy], now=T0 + timedelta(days=1))
    res = predictions(store, "org/d3")["by-residual"]
    assert res["state"] == "not_evaluated" and res["p_hat"] is None
    assert "at least 2 labelled base/derivative pairs of relation finetune with a scored base (found 1)" \
        in res["detail"]["reason"]
    assert predictions(store, "org/d3")["by-base"]["state"] != "not_evaluated"


def test_a_derivative_waits_for_its_queued_base_and_the_listing_shows_both_coordinates(tmp_path) -> None:
    policy = load_policy(write_policy(tmp_path / "policies"))
    store = Store.open(tmp_path / "state" / "lstar.duckdb")
    b, d = fake_sha("base"), fake_sha("ft")
    base_id = add_checkpoint(store, "up/base", b, rule=None)          # gated, not scored yet
    add_checkpoint(store, "org/ft", d, base=("up/base", b))
    scored(store, "org/ft", d, 1.0)
    evaluate_pending(store, [policy], now=T0 + timedelta(hours=1))
    assert predictions(store, "org/ft") == {}                          # held on the queue
    scored(store, "up/base", b, 1.4, hours=2)
    evaluate_pending(store, [policy], now=T0 + timedelta(hours=3))
    got = predictions(store, "org/ft")["by-base"]["detail"]["derivative"]
    assert (got["coordinate"], got["lstar_base"], got["lstar_own"]) == ("base", 1.4, 1.0)

    page = checkpoints_page(store, repo="org/ft")
    [row] = page.items
    assert row["base"]["repo"] == "up/base" and row["base"]["checkpoint_id"] == base_id
    assert (row["coordinates"]["lstar_base"], row["coordinates"]["lstar"]) == (1.4, 1.0)
    assert checkpoints_page(store, repo="up/base").items[0]["base"] is None

    # A base refused by the gate: the derivative is predicted from its own L*, saying why.
    other, ft2 = fake_sha("other"), fake_sha("ft2")
    add_checkpoint(store, "up/other", other, status="skipped", rule=None)
    add_checkpoint(store, "org/ft2", ft2, base=("up/other", other))
    scored(store, "org/ft2", ft2, 1.2, hours=4)
    evaluate_pending(store, [policy], now=T0 + timedelta(hours=5))
    own = predictions(store, "org/ft2")["by-base"]["detail"]
    assert own["derivative"]["coordinate"] == "own" and own["value"] == 1.2
    assert "has no complete score on this corpus and spec (skipped" in own["derivative"]["own_reason"]

    report = build_report(store, policy, now=T0 + timedelta(hours=6), period_start=T0 - timedelta(days=1))
    [group] = [g for g in report["derivatives"] if g["base"] == "up/base"]
    [ft] = group["derivatives"]
    assert (ft["repo"], ft["relation"], ft["lstar_base"], ft["lstar"]) == ("org/ft", "finetune", 1.4, 1.0)
    assert ft["tasks"]["by-base"]["coordinate"] == "base" and ft["tasks"]["by-base"]["rho_measured"] is False
    text = to_markdown(report)
    assert "## Derivatives by base" in text and "| org/ft@" in text and "from L*(base); ρ unmeasured" in text
    assert "** (from L*(base) 1.4000; ρ unmeasured) |" in text      # the task table says it too
    page = to_html(report, {})
    assert "<h2>Derivatives by base</h2>" in page and "from L*(base); ρ unmeasured" in page

    # `lstar checkpoints` shows the base and the pair L*(base) → L*.
    store.close()
    shown = lstar_in_process("checkpoints", "--db", str(tmp_path / "state" / "lstar.duckdb"),
                             env={"COLUMNS": "400"})
    assert shown.returncode == 0, shown.stderr
    [line] = [ln for ln in shown.stdout.splitlines() if "org/ft " in ln]
    assert f"finetune of up/base@{b[:12]}" in line and "1.4000 → 1.0000" in line


def test_evaluate_mode_evaluates_every_derivative_and_needs_an_evaluate_block(world) -> None:
    from monitor.alerts.observations import schedule_observations

    policy, store, shas, tmp = world
    path = tmp / "policies" / "gov.yaml"
    path.write_text(path.read_text().replace("derivatives: residual", "derivatives: evaluate"))
    with pytest.raises(PolicyError) as err:
        load_policy(path)
    assert str(err.value).splitlines()[0].endswith(
        "tasks[1]: derivatives: evaluate needs an `evaluate:` block (how to run the task)")
    (tmp / "policies" / "mc.jsonl").write_text(json.dumps(
        {"id": "q1", "context": "two plus two is", "choices": [" four", " five"], "answer": 0}) + "\n")
    path.write_text(path.read_text().replace(
        "derivatives: evaluate", "derivatives: evaluate\n    evaluate: {file: mc.jsonl, on: [clear]}"))
    policy = load_policy(path)
    evaluate_pending(store, [policy], now=T0 + timedelta(days=1))
    states = {r["repo"]: r["state"] for r in store.query(
        "SELECT repo, state FROM predictions WHERE task = 'by-residual'")}
    assert "clear" not in states.values()        # `on: [clear]` alone would evaluate nothing
    counts = schedule_observations(store, [policy], now=T0 + timedelta(days=1))
    observed = sorted(r["repo"] for r in store.query("SELECT repo FROM observations WHERE task = 'by-residual'"))
    # every derivative (its state notwithstanding), no base
    assert observed == ["org/d1", "org/d2", "org/d3"] and counts["scheduled"] == 3
    # Their observations measure the residual, not the curve's error: kept out of its track record.
    from monitor.alerts.observations import observation_fields, track_records

    now = T0 + timedelta(days=1)
    done = 0
    while (job := store.claim_observation("me", now=now, lease_s=60, max_attempts=3)) is not None:
        value = min(1.0, float(job["predicted_hi"]) + 0.2)
        store.complete_observation(job["id"], "me", status="done", now=now,
                                   fields=observation_fields(job, value, 1000, round(value * 1000)))
        done += 1
    assert done == 3
    assert all(r["checked"] == 0 for r in track_records(store))


def test_reference_bases_are_queued_once_and_only_when_the_policy_asks(tmp_path) -> None:
    watch = "watch:\n  - name: r\n    author: org\n"
    quiet = load_policy(write_policy(tmp_path / "quiet", watch=watch, name="quiet"))
    asking = load_policy(write_policy(tmp_path / "asking", score_bases=True, watch=watch, name="asking"))
    store = Store.open(tmp_path / "state" / "lstar.duckdb")
    b = fake_sha("base")
    add_checkpoint(store, "org/ft", fake_sha("ft"), base=("up/base", b))
    add_checkpoint(store, "org/q", fake_sha("q"), base=("up/base", b), relation="quantized")
    add_checkpoint(store, "org/merged", fake_sha("m"))   # no base: nothing to add
    assert add_reference_bases(store, [quiet], now=T0) == []
    [added] = add_reference_bases(store, [quiet, asking], now=T0)
    assert add_reference_bases(store, [asking], now=T0 + timedelta(hours=1)) == []
    row = store.get_checkpoint(added.id)
    assert (row.repo, row.sha, row.source, row.rule, row.refs, row.status) == (
        "up/base", b, "hub", "reference:r", [], "discovered")
    why = row.meta["reference_base"]
    assert why["policies"] == ["asking"] and [d["repo"] for d in why["derivatives"]] == ["org/ft", "org/q"]
    assert "pinned base of org/ft@" in why["reason"] and "lineage.score_bases" in why["reason"]
    assert store.query("SELECT count(*) AS n FROM checkpoints WHERE repo = 'up/base'")[0]["n"] == 1
    store.close()


def card(front_matter: str) -> bytes:
    return f"---\nlibrary_name: transformers\n{front_matter}\n---\n\n# a derivative\n".encode()


def fp16_resave(files: dict[str, bytes]) -> dict[str, bytes]:
    """The same model saved in float16: a quantized re-save of it."""
    from safetensors.torch import load, save

    weights = {name: t.half().contiguous() for name, t in load(files["model.safetensors"]).items()}
    config = json.loads(files["config.json"])
    return {**files, "model.safetensors": save(weights),
            "config.json": json.dumps({**config, "torch_dtype": "float16"}).encode()}


@pytest.mark.slow
def test_the_daemon_scores_a_reference_base_and_reports_its_derivatives_on_both_coordinates(tmp_path, shared_dir):
    """On the fake Hub: a base outside the watch rules, a full fine-tune declared by its card, a
    float16 re-save declared quantized and a LoRA adapter; `lstar run --once` discovers the
    derivatives, links them, queues the base as a reference through the same gate, scores all
    four (the adapter merged into its pinned base in the scoring child) and judges the
    derivatives from L*(base); the listing and the report show both coordinates."""
    import subprocess

    from monitor.demo.fakehub import FakeHub
    from monitor.demo.hub_repos import tiny_model_files
    from monitor.scoring.corpus import load_corpus
    from support.daemon_harness import DaemonProcess

    from test_adapters import lora_files
    from test_daemon_events import fit_arith_curve

    base_files = tiny_model_files("gpt2", arch="llama", seed=3)
    folder = tmp_path / "policies"
    folder.mkdir()
    corpus = load_corpus(shared_dir / "corpus" / "calib-v0").select(first=2).sha256   # --docs 2
    fit_arith_curve(corpus, folder / "arith.json")
    (folder / "gov.yaml").write_text(
        "name: gov\nwatch:\n  - name: org\n    author: org\nlineage: {score_bases: true}\n"
        f"corpora: {{public: {corpus}}}\ntasks:\n  - name: arith\n    curve: arith.json\n"
        "route: {receiver: log, group_wait: 0s, group_interval: 0s}\n"
        f"receivers:\n  - name: log\n    file: {{path: {folder / 'alerts.jsonl'}}}\n")
    with FakeHub() as hub:
        base_sha = hub.add_repo("upstream/base", base_files)
        hub.add_repo("org/ft", {**tiny_model_files("gpt2", arch="llama", seed=4),
                                "README.md": card("base_model: upstream/base\nbase_model_relation: finetune")})
        hub.add_repo("org/fp16", {**fp16_resave(base_files),
                                  "README.md": card("base_model: upstream/base\nbase_model_relation: quantized")})
        lora = lora_files(base_files, module="q_proj",
                          config={"base_model_name_or_path": "upstream/base", "target_modules": ["q_proj"]})
        hub.add_repo("org/lora", {**lora, "README.md": card("base_model: upstream/base\nbase_model_relation: adapter")})
        daemon = DaemonProcess(folder, tmp_path / "state", endpoint=hub.url, fast=False,
                               args=["--once", "--cache-dir", str(tmp_path / "cache"),
                                     "--corpus", str(shared_dir / "corpus" / "calib-v0"), "--docs", "2",
                                     "--max-context", "128", "--n-boot", "10"])
        done = subprocess.run(daemon.command(), capture_output=True, text=True, env=daemon.env, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]

    db = tmp_path / "state" / "lstar.duckdb"
    with Store.open(db, read_only=True) as store:
        rows = {r.repo: r for r in store.list_checkpoints()}
        assert {r: rows[r].status for r in rows} == {"org/ft": "scored", "org/fp16": "scored", "org/lora": "scored",
                                                     "upstream/base": "scored"}, done.stderr[-3000:]
        base = rows["upstream/base"]
        assert (base.sha, base.rule, base.refs) == (base_sha, "reference:org", [])
        assert base.meta["gate"]["verdict"] == "passed"          # the same gate as any checkpoint
        assert "lineage.score_bases" in base.meta["reference_base"]["reason"]
        links = {r: store.checkpoint_base(rows[r].id) for r in ("org/ft", "org/fp16", "org/lora")}
        got = {r: (b["base_repo"], b["base_sha"], b["relation"], b["base_checkpoint_id"]) for r, b in links.items()}
        assert got == {
            "org/ft": ("upstream/base", base_sha, "finetune", base.id),
            "org/fp16": ("upstream/base", base_sha, "quantized", base.id),
            "org/lora": ("upstream/base", base_sha, "adapter", base.id)}
        runs = {r["model_repo"]: r for r in store.query("SELECT model_repo, lstar, se_ce FROM score_runs")}
        # A float16 re-save of the same weights reads nearly the base's L*; the fine-tune does not.
        assert abs(runs["org/fp16"]["lstar"] - runs["upstream/base"]["lstar"]) < 0.01
        assert abs(runs["org/ft"]["lstar"] - runs["upstream/base"]["lstar"]) > 0.01
        # The adapter was merged into its pinned base: its own L* moves, and its score names both commits.
        assert abs(runs["org/lora"]["lstar"] - runs["upstream/base"]["lstar"]) > 0.01
        [lora_model] = store.query("SELECT model FROM score_runs WHERE model_repo = 'org/lora'")
        assert json.loads(lora_model["model"])["base"] == {"repo": "upstream/base", "sha": base_sha,
                                                           "relation": "adapter"}
        preds = {p["repo"]: json.loads(p["detail"]) for p in
                 store.query("SELECT repo, detail FROM predictions WHERE task = 'arith'")}
        assert "upstream/base" not in preds                       # a reference, not watched
        for repo in ("org/ft", "org/fp16", "org/lora"):
            d = preds[repo]["derivative"]
            assert (d["coordinate"], d["rho_measured"]) == ("base", False)
            assert d["lstar_base"] == pytest.approx(runs["upstream/base"]["lstar"])
            assert d["lstar_own"] == pytest.approx(runs[repo]["lstar"])
        report = build_report(store, load_policy(folder / "gov.yaml"), now=datetime.now(timezone.utc),
                              period_start=datetime.now(timezone.utc) - timedelta(days=1))
    [group] = report["derivatives"]
    assert (group["base"], group["base_sha"]) == ("upstream/base", base_sha)
    assert group["lstar_base"] == pytest.approx(runs["upstream/base"]["lstar"])
    listed = {d["repo"]: d for d in group["derivatives"]}
    assert {r: (d["relation"], d["lstar"]) for r, d in listed.items()} == {
        r: (rel, pytest.approx(runs[r]["lstar"]))
        for r, rel in (("org/ft", "finetune"), ("org/fp16", "quantized"), ("org/lora", "adapter"))}
    assert all(d["tasks"]["arith"]["coordinate"] == "base" for d in listed.values())

    shown = lstar_in_process("checkpoints", "--db", str(db), "--json")
    assert shown.returncode == 0, shown.stderr
    items = {i["repo"]: i for i in json.loads(shown.stdout)["items"]}
    assert items["org/ft"]["coordinates"]["lstar_base"] == pytest.approx(runs["upstream/base"]["lstar"])
    assert items["org/ft"]["coordinates"]["lstar"] == pytest.approx(runs["org/ft"]["lstar"])
    assert items["upstream/base"]["base"] is None


@pytest.fixture(scope="module")
def small_and_large(tmp_path_factory):
    from monitor.demo.hub_repos import tiny_model_files

    build = tmp_path_factory.mktemp("build")
    return (tiny_model_files(seed=1, hidden=16, build_dir=build),
            tiny_model_files(seed=2, hidden=64, build_dir=build))


def test_a_reference_base_is_gated_with_the_budgets_of_the_rule_that_found_its_derivative(
        tmp_path, monkeypatch, small_and_large) -> None:
    """The gate itself, on the fake Hub: a base too large for the derivative's rule is refused
    with the gate's reason; one within it is gated."""
    from huggingface_hub import constants

    from monitor.alerts.reference_bases import reference_rules
    from monitor.hub.client import HubClient, RetryPolicy
    from monitor.hub.gate import gate_pending
    from monitor.hub.poll import poll_once
    from monitor.hub.rules import Budgets, WatchRule
    from monitor.demo.fakehub import FakeHub
    from monitor.demo.hub_repos import read_safetensors_header

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    small, large = small_and_large

    def params(files):
        header = read_safetensors_header(files["model.safetensors"])
        return sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    assert params(small) < params(large)
    rule = WatchRule(name="org", author="org", budgets=Budgets(max_params=params(small) + 1))
    policy = load_policy(write_policy(tmp_path / "policies", score_bases=True,
                                      watch="watch:\n  - name: org\n    author: org\n"))
    store = Store.open(tmp_path / "state.duckdb")
    with FakeHub() as hub:
        big_sha = hub.add_repo("up/big", large)
        small_sha = hub.add_repo("up/small", small)
        hub.add_repo("org/ft-big", {**small, "README.md": card("base_model: up/big")})
        hub.add_repo("org/ft-small", {**small, "README.md": card("base_model: up/small")})
        client = HubClient(hub.url, token=False, store=store, policy=RetryPolicy(attempts=1))
        poll_once(store, client, [rule])
        gating = [rule, *reference_rules([rule])]
        first = gate_pending(store, client, gating, cache_dir=tmp_path / "hf" / "hub")
        added = add_reference_bases(store, [policy], now=T0)
        second = gate_pending(store, client, gating, cache_dir=tmp_path / "hf" / "hub")
    assert sorted(o.repo for o in first) == ["org/ft-big", "org/ft-small"] and all(o.status == "gated" for o in first)
    assert sorted((a.repo, a.sha) for a in added) == [("up/big", big_sha), ("up/small", small_sha)]
    verdicts = {o.repo: (o.status, o.reason) for o in second}
    assert verdicts["up/small"] == ("gated", None)
    assert verdicts["up/big"][0] == "skipped" and "max_params" in verdicts["up/big"][1], verdicts
    # Without the reference rules the gate would have used the default budgets and passed it.
    assert params(large) < Budgets().max_params
    store.close()
