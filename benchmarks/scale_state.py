"""States of many checkpoints for `scale.py`: built through the store's API, or bulk-loaded.

A state is `n_lineages` Hub repos (`org-NNN/lineage-NNNNNN`), each with `per_lineage`
checkpoints, one every STEP (18 days), watched by one policy with two tasks (`cloze`, `arc`);
every FINETUNE_EVERY-th lineage (j % 20 == 1) is a fine-tune of lineage j - 1. Each checkpoint
goes through the daemon's steps with their facts in its meta (~2 KB: gate, fetch, score). Lineage j
follows the L* trajectory of shape j % len(SHAPES) (one that emerges, one that stays clear,
one that crosses and comes back, one that hovers near the threshold), and its history starts
`span / n_lineages` after lineage j-1's, so the lineages' activity is spread over `span`
(a year) ending at `t_end`.

`build_api_state` writes lineages the way the daemon does: the poller's
`Store.record_discoveries`, `Store.record_score_run` (50 document rows per score),
`Store.set_checkpoint_verdict` (gated with the gate's facts and base, fetched, scored), the
outbox's `evaluate_pending` and the `Dispatcher` (alerts grouped and sent to a file receiver),
in time order, then the poller's idle listings every 15 minutes over the retention,
51 weekly reports (`Store.record_report`) and `Store.prune_logs` at the retention.

`bulk_state` builds the first len(SHAPES) lineages that way (the template) and copies them
with set-based INSERT ... SELECT into lineages 0..n-1 of a database opened (and migrated)
by `Store.open`: names replaced, every timestamp shifted by the lineage's offset. Each
lineage's rows depend only on its own history (the outbox's decisions read the lineage's
history; the default grouping is per (policy, repo, commit)), so the copy equals what
`build_api_state` writes for the same lineages; `compare_states` checks that (ids, and the
timestamps and ids inside frozen JSON bodies, aside).
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

CORPUS = "c" * 64
SPEC = {"spec_version": "lstar-score/1", "window_len": 64, "stride": 32, "prefix_policy": "bos"}
TOKENIZER = {"fingerprint": "a1" * 32, "source": "bench", "vocab_size": 50_000, "prefix_policy": "bos",
             "prefix_token_id": 0}
CE_UNIGRAM = 7.2
DOCS_PER_SCORE = 50
PER_LINEAGE = 20
SPAN = timedelta(days=365)
# A lineage publishes a checkpoint every 18 days and the lineages' starts are staggered over
# the rest of the year, so a week's new runs fall into about 7/18 of all lineages (about
# 1,900 of 5,000 at 10^5 checkpoints), as on a Hub where many projects train at once.
STEP = timedelta(days=18)
FINETUNE_EVERY = 20          # lineage j with j % 20 == 1 is a fine-tune of lineage j - 1 (5 %)
POLL_EVERY = timedelta(minutes=15)
REPORTS = 51                 # weekly reports recorded before t_end (the last one a week ago)
WEIGHT_SHARDS = 4
TASKS = {"cloze": (0.25, 0.0455, 1.2), "arc": (0.25, 0.05, 0.8)}   # baseline, margin, L* midpoint
# L* of checkpoint i of a lineage (i = 0 .. per_lineage-1, x = i / (per_lineage - 1)).
SHAPES = (
    lambda x: 3.0 - 2.7 * x,                                   # emerges on both tasks
    lambda x: 3.1 - 0.4 * x,                                   # stays clear
    lambda x: 3.0 - 2.6 * x if x < 0.6 else 1.44 + 2.0 * (x - 0.6),   # crosses, then back above
    lambda x: 1.35 + 0.15 * ((-1) ** round(x * 19)),           # hovers near cloze's threshold
)
TEMPLATE_LINEAGES = FINETUNE_EVERY   # every shape, and one fine-tune


def is_finetune(j: int) -> bool:
    return j % FINETUNE_EVERY == 1


def repo_name(j: int) -> str:
    """The repo id of lineage j (fixed width, so no name is a prefix of another)."""
    return f"org-{j // 50:03d}/lineage-{j:06d}"


def commit_sha(repo: str, i: int) -> str:
    """The commit of checkpoint i of `repo` (the same sha in every lineage copied from one
    template lineage, so that copying only rewrites repo names)."""
    return hashlib.sha256(f"step-{i}".encode()).hexdigest()[:40]


def run_id_of(repo: str, sha: str) -> str:
    """The score run id of (repo, sha); the same formula is used in SQL by the bulk loader."""
    return hashlib.sha256(f"{repo}@{sha}".encode()).hexdigest()[:32]


def lineage_start(j: int, n_lineages: int, t_end: datetime, per_lineage: int = PER_LINEAGE) -> datetime:
    """When lineage j's first checkpoint is scored: lineages start evenly over SPAN and the
    last one's last checkpoint lands an hour before `t_end`."""
    last_start = t_end - timedelta(hours=1) - STEP * (per_lineage - 1)
    spacing = (SPAN - STEP * (per_lineage - 1)) / max(1, n_lineages)
    # whole seconds, so that SQL interval arithmetic on the copies is exact
    return last_start - timedelta(seconds=int((spacing * (n_lineages - 1 - j)).total_seconds()))


def lstar_of(j: int, i: int, per_lineage: int = PER_LINEAGE) -> float:
    x = i / max(1, per_lineage - 1)
    return round(SHAPES[j % len(SHAPES)](x), 4)


# -- policy and curves ----------------------------------------------------------------------------
def write_policy(folder: Path) -> Path:
    """Two task curves (fitted on synthetic labels) and `folder/policies/bench.yaml`; the
    policies folder."""
    import numpy as np

    from monitor.curves.artifact import ScoringRef, save_curve
    from monitor.curves.fit import fit_curve
    from monitor.curves.labels import Label

    folder = Path(folder)
    policies = folder / "policies"
    curves = policies / "curves"
    curves.mkdir(parents=True, exist_ok=True)
    spec = ScoringRef(spec_version=SPEC["spec_version"], window=SPEC["window_len"], stride=SPEC["stride"],
                      prefix_policy=SPEC["prefix_policy"])
    for task, (baseline, margin, mid) in TASKS.items():
        path = curves / f"{task}.json"
        if path.exists():
            continue
        rng = np.random.default_rng(0)
        xs = np.linspace(0.0, 3.2, 16)
        labels = [Label(checkpoint=f"h{i}", value=float(np.clip(baseline + 0.6 / (1 + np.exp(4 * (x - mid)))
                                                                  + rng.normal(0, 0.02), 0, 1)),
                        family="f1" if i % 2 else "f2", task=task, metric="acc", n=200, lstar=float(x))
                  for i, x in enumerate(xs)]
        curve = fit_curve(labels, task=task, metric="acc", baseline=baseline, margin=margin, resamples=100,
                          lofo=False, corpus_sha256=CORPUS, scoring_spec=spec)
        save_curve(curve, path)
    (policies / "bench.yaml").write_text(f"""\
name: bench
tasks:
  - name: cloze
    curve: curves/cloze.json
  - name: arc
    curve: curves/arc.json
corpora:
  public: {CORPUS}
route:
  receiver: audit
receivers:
  - name: audit
    file:
      path: {folder / "audit.jsonl"}
reports:
  - name: weekly
    schedule:
      every: 7d
    receivers: [audit]
    window: 7d
""")
    return policies


def load_bench_policy(policies: Path) -> Any:
    from monitor.policy.load import load_policy

    return load_policy(Path(policies) / "bench.yaml")


# -- the API path ---------------------------------------------------------------------------------
def score_run(repo: str, sha: str, checkpoint_id: int, lstar: float, when: datetime
              ) -> tuple[dict[str, Any], list[tuple[str, str, int, float, int]]]:
    """A score run row (as the engine writes it) and its 50 document rows."""
    se = 0.02 + 0.01 * (lstar > 2)
    rid = run_id_of(repo, sha)
    docs = [(f"doc-{d:03d}", ("web", "code", "wiki")[d % 3], 200 + d, round((lstar + CE_UNIGRAM) * (200 + d), 6),
             800 + 4 * d) for d in range(DOCS_PER_SCORE)]
    n_tokens = sum(d[2] for d in docs)
    n_bytes = sum(d[4] for d in docs)
    ce = lstar + CE_UNIGRAM
    run = {"run_id": rid, "checkpoint_id": checkpoint_id, "model_repo": repo, "model_sha": sha,
           "model_source": "hub", "tokenizer_fingerprint": TOKENIZER["fingerprint"], "corpus_sha256": CORPUS,
           **SPEC, "dtype": "float32", "device": "cpu", "n_tokens": n_tokens, "n_bytes": n_bytes,
           "nll_sum": ce * n_tokens, "ce": ce, "ce_unigram": CE_UNIGRAM, "lstar": lstar,
           "l_rel": ce / CE_UNIGRAM, "l_gain": -lstar / CE_UNIGRAM, "bits_per_byte": 1.0,
           "tokens_per_byte": n_tokens / n_bytes, "se_ce": se, "weighted_ppl": None,
           "reference_fingerprint": None, "slices": {"web": {"ce": ce}, "code": {"ce": ce}, "wiki": {"ce": ce}},
           "tcb": {"mean": 40.0 + 30 * lstar, "median": 3.5 + lstar}, "spec": SPEC,
           "model": {"repo": repo, "sha": sha}, "library_versions": {"torch": "bench"}, "wall_s": 60.0,
           "tokens_per_s": n_tokens / 60.0, "finished_at": when}
    return run, docs


CORPUS_ROW = {"sha256": CORPUS, "name": "calib", "version": "0", "parent_sha256": CORPUS, "selection": "all",
              "n_documents": DOCS_PER_SCORE, "n_bytes": 50_000}


def _digest(*parts: Any) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def base_of(j: int, per_lineage: int = PER_LINEAGE) -> dict[str, Any] | None:
    """What a fine-tune lineage's checkpoints derive from, as the gate pins it (`Lineage`): the
    first checkpoint of lineage j - 1 (scored before any of lineage j's); None for a model."""
    if not is_finetune(j) or j == 0:
        return None
    base_repo = repo_name(j - 1)
    return {"base_repo": base_repo, "base_sha": commit_sha(base_repo, 0), "relation": "finetune",
            "relation_source": "declared", "bases": [base_repo], "problem": None}


def gate_meta(repo: str, sha: str, i: int, when: datetime, base: dict[str, Any] | None) -> dict[str, Any]:
    """The gate's facts as `monitor.hub.gate._gate` writes them (config, safetensors headers,
    estimates, the pinned files, the commit date and, for a derivative, its lineage)."""
    files = [{"name": name, "size": size, "sha256": _digest(sha, name) if lfs else None,
              "blob_id": None if lfs else _digest(sha, name)[:40]}
             for name, size, lfs in [("config.json", 712, False), ("generation_config.json", 137, False),
                                     ("model.safetensors.index.json", 23_950, False),
                                     ("tokenizer.json", 2_113_720, True), ("tokenizer_config.json", 3_502, False),
                                     *[(f"model-{k + 1:05d}-of-{WEIGHT_SHARDS:05d}.safetensors",
                                        1_982_000_000 + 1000 * k, True) for k in range(WEIGHT_SHARDS)]]]
    return {"verdict": "passed", "model_type": "llama", "architectures": ["LlamaForCausalLM"],
            "hidden_size": 2048, "num_hidden_layers": 22, "num_attention_heads": 32, "vocab_size": 32_000,
            "max_position_embeddings": 2048, "torch_dtype": "bfloat16", "n_params": 1_100_048_384,
            "tensor_bytes": 2_200_096_768, "dtypes": {"BF16": 201}, "n_tensors": 201,
            "estimated_params": 1_100_048_384, "estimated_peak_bytes": 4_400_193_536, "files": files,
            "commit_date": (when - timedelta(hours=2)).isoformat(),
            **({"lineage": base} if base is not None else {})}


def fetch_meta(repo: str, sha: str, when: datetime) -> dict[str, Any]:
    """What `monitor.hub.fetch.fetch_job` merges into the row: the snapshot and its digests."""
    return {"snapshot_dir": f"/var/lib/lstar/cache/models--{repo.replace('/', '--')}/snapshots/{sha}",
            "fetched_at": (when - timedelta(minutes=20)).isoformat(),
            "weights_digest": _digest("weights", sha), "files_digest": _digest("files", sha)}


def score_meta(run: dict[str, Any]) -> dict[str, Any]:
    """What the scoring driver merges into the row when the score is written."""
    return {"run_id": run["run_id"], "lstar": run["lstar"], "se": run["se_ce"], "corpus_sha256": CORPUS,
            "tokens_per_s": run["tokens_per_s"], "baseline": "corpus", "worker": "gpu-0"}


def record_checkpoint(store: Any, policy: Any, repo: str, i: int, lstar: float, when: datetime,
                      *, evaluate: bool = True, base: dict[str, Any] | None = None) -> str:
    """One checkpoint through the daemon's store calls: discovered (one poll), gated (the gate's
    facts and, for a derivative, its `checkpoint_bases` row), fetched (digests), scored (50
    document rows, the score's facts), and, with `evaluate`, evaluated and its alerts
    dispatched. Returns the run id."""
    from monitor.alerts import Dispatcher
    from monitor.alerts.evaluation_tick import evaluate_pending
    from monitor.hub.poll import Candidate

    sha = commit_sha(repo, i)
    store.record_discoveries("bench-rule", "bench", "http://hub.invalid",
                             [Candidate(repo, sha, (f"step{i}",), meta={})],
                             watermark=None, boundary=[], now=when - timedelta(minutes=30), requests=1,
                             listed=1)
    checkpoint_id = store.query("SELECT id FROM checkpoints WHERE repo = ? AND sha = ?", [repo, sha])[0]["id"]
    run, docs = score_run(repo, sha, checkpoint_id, lstar, when)
    store.set_checkpoint_verdict(checkpoint_id, expect_status="discovered", status="gated", reason=None,
                                 meta={"gate": gate_meta(repo, sha, i, when, base)},
                                 now=when - timedelta(minutes=29), base=base)
    store.set_checkpoint_verdict(checkpoint_id, expect_status="gated", status="fetched", reason=None,
                                 meta=fetch_meta(repo, sha, when), now=when - timedelta(minutes=20))
    store.record_score_run(run, docs, CORPUS_ROW, TOKENIZER)
    store.set_checkpoint_verdict(checkpoint_id, expect_status="fetched", status="scored", reason=None,
                                 meta=score_meta(run), now=when)
    if evaluate:
        evaluate_pending(store, [policy], now=when + timedelta(seconds=5))
        Dispatcher(store, [policy], owner="bench").run_once(when + timedelta(seconds=40))
    return run["run_id"]


def record_idle_polls(store: Any, *, start: datetime, end: datetime) -> int:
    """The poller's listings that found nothing new, one every POLL_EVERY in [start, end),
    through `Store.record_discoveries` (the API path; the bulk loader writes the same rows in SQL)."""
    n, when = 0, end - POLL_EVERY
    while when >= start:
        store.record_discoveries("bench-rule", "bench", "http://hub.invalid", [], watermark=None, boundary=[],
                                 now=when, requests=1, listed=0)
        n += 1
        when -= POLL_EVERY
    return n


def record_weekly_reports(store: Any, *, t_end: datetime, n: int = REPORTS) -> None:
    """The daemon's weekly reports, the newest ending a week before `t_end` (so the next one,
    the one measured, covers the last week), through `Store.record_report`."""
    for k in range(n, 0, -1):
        end = t_end - timedelta(days=7 * k)
        summary = {"new_checkpoints": 40 + k % 7, "new_scores": 40 + k % 7, "lineages": 38, "at_risk": k % 3,
                   "emerged": k % 5, "crossings": k % 4}
        store.record_report({"policy": "bench", "name": "weekly", "period_start": end - timedelta(days=7),
                             "period_end": end, "folder": f"/var/lib/lstar/reports/bench/weekly/{end:%Y%m%dT%H%M%SZ}",
                             "summary": summary,
                             "deliveries": [{"receiver": "audit", "outcome": "delivered", "error": None}],
                             "created_at": end + timedelta(seconds=3)})


def build_api_state(store: Any, policy: Any, lineages: range | list[int], *, n_lineages: int,
                    t_end: datetime, per_lineage: int = PER_LINEAGE,
                    retention: timedelta | None = timedelta(days=90)) -> None:
    """Write `lineages` (indices into a state of `n_lineages`) through the store's API, in time
    order, then prune the logs at `retention` before `t_end` as the daemon's prune job does
    (None: not pruned)."""
    events = sorted((lineage_start(j, n_lineages, t_end, per_lineage) + STEP * i, j, i)
                    for j in lineages for i in range(per_lineage))
    for when, j, i in events:
        record_checkpoint(store, policy, repo_name(j), i, lstar_of(j, i, per_lineage), when,
                          base=base_of(j, per_lineage))
    if retention is not None:
        record_idle_polls(store, start=t_end - retention, end=t_end)
        record_weekly_reports(store, t_end=t_end)
        store.prune_logs(t_end - retention)


# -- the bulk loader ------------------------------------------------------------------------------
def _columns(conn: Any, table: str) -> list[tuple[str, str]]:
    """(name, type) of each column of `table` in the store's own database (not the template's)."""
    return [(r[0], r[1]) for r in conn.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_catalog = current_database() "
        "AND table_schema = 'main' AND table_name = ? ORDER BY ordinal_position", [table]).fetchall()]


def _copy_sql(conn: Any, table: str, special: dict[str, str | None], joins: str, tail: str = "") -> str:
    """INSERT INTO table (cols) SELECT <expression per column> FROM tpl.table t {joins} {tail}.

    `joins` must bring in `m` (a lineage_map row: repo, src_repo, shift_s). Timestamps are
    shifted by m.shift_s, VARCHAR and JSON text has the template repo replaced by the copy's;
    `special` overrides a column's expression (None: left to its default, e.g. an id)."""
    cols, exprs = [], []
    for name, dtype in _columns(conn, table):
        if name in special:
            if special[name] is None:
                continue
            expr = special[name]
        elif dtype.startswith("TIMESTAMP"):
            expr = f"t.{name} + to_seconds(m.shift_s)"
        elif dtype in ("JSON", "VARCHAR"):
            expr = f"replace(t.{name}::VARCHAR, m.src_repo, m.repo)"
        else:
            expr = f"t.{name}"
        cols.append(name)
        exprs.append(expr)
    return f"INSERT INTO {table} ({', '.join(cols)}) SELECT {', '.join(exprs)} FROM tpl.{table} t {joins} {tail}"


def bulk_state(store: Any, template_db: Path, *, n_lineages: int, t_end: datetime,
               per_lineage: int = PER_LINEAGE, retention: timedelta = timedelta(days=90)) -> dict[str, float]:
    """Copy the template's lineages (built by `build_api_state` for lineages 0..SHAPES-1 of a
    state of `n_lineages`, unpruned, in `template_db`) into lineages 0..n_lineages-1 of `store`
    (opened and migrated by `Store.open`), set-based, then prune the logs at `retention` as
    `build_api_state` does. Returns seconds per table."""
    import time

    from monitor.alerts.rules import fingerprint
    from monitor.store.placing import PLACEMENT_EXTRACT

    conn = store.conn
    conn.execute(f"ATTACH '{template_db}' AS tpl (READ_ONLY)")
    timings: dict[str, float] = {}

    def timed(name: str, sql: str) -> None:
        t0 = time.perf_counter()
        with store.transaction() as c:
            c.execute(sql)
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - t0

    try:
        starts = {s: lineage_start(s, n_lineages, t_end, per_lineage) for s in range(TEMPLATE_LINEAGES)}
        last_start = lineage_start(n_lineages - 1, n_lineages, t_end, per_lineage)
        spacing = int(((SPAN - STEP * (per_lineage - 1)) / max(1, n_lineages)).total_seconds())
        src_starts = ", ".join(f"({s}, {int(starts[s].timestamp())})" for s in starts)
        # Lineage j: its repo, its template lineage's repo, and the shift between their starts
        # (lineage_start in SQL, whole seconds).
        conn.execute(
            "CREATE OR REPLACE TEMP TABLE lineage_map AS SELECT r.range AS j, "
            "'org-' || lpad((r.range // 50)::VARCHAR, 3, '0') || '/lineage-' || lpad(r.range::VARCHAR, 6, '0') AS repo, "
            "'org-000/lineage-' || lpad(s.src::VARCHAR, 6, '0') AS src_repo, "
            f"{int(last_start.timestamp())} - ({n_lineages} - 1 - r.range) * {spacing} - s.start_s AS shift_s "
            f"FROM range({n_lineages}) r JOIN (VALUES {src_starts}) s(src, start_s) "
            f"ON s.src = r.range % {TEMPLATE_LINEAGES}")
        run_id = "substr(sha256(m.repo || '@' || t.model_sha), 1, 32)"
        conn.execute("INSERT INTO corpora SELECT * FROM tpl.corpora ON CONFLICT DO NOTHING")
        conn.execute("INSERT INTO tokenizers SELECT * FROM tpl.tokenizers ON CONFLICT DO NOTHING")
        # the score facts in a row's meta name its run id, which hashes the repo
        meta = ("replace(replace(t.meta::VARCHAR, m.src_repo, m.repo), substr(sha256(m.src_repo || '@' || t.sha), 1, 32), "
                "substr(sha256(m.repo || '@' || t.sha), 1, 32))")
        placing = PLACEMENT_EXTRACT.format(meta=f"CAST({meta} AS JSON)")   # from the copy's meta, as every writer does
        timed("checkpoints", _copy_sql(conn, "checkpoints", {"id": None, "meta": meta, "placing_values": placing},
                                       "JOIN lineage_map m ON m.src_repo = t.repo", "ORDER BY m.j, t.id"))
        # A fine-tune's base is the lineage before it: its repo is renamed to that lineage's copy.
        timed("checkpoint_bases", _copy_sql(
            conn, "checkpoint_bases", {"checkpoint_id": "nc.id", "base_repo": "mb.repo",
                                       "bases": "replace(t.bases::VARCHAR, t.base_repo, mb.repo)"},
            "JOIN tpl.checkpoints c ON c.id = t.checkpoint_id JOIN lineage_map m ON m.src_repo = c.repo "
            "JOIN lineage_map mb ON mb.j = m.j - 1 JOIN checkpoints nc ON nc.repo = m.repo AND nc.sha = c.sha"))
        # run ids are recomputed from (repo, sha), checkpoint ids looked up by (repo, sha)
        timed("score_runs", _copy_sql(conn, "score_runs", {"run_id": run_id, "checkpoint_id": "c.id"},
                                      "JOIN lineage_map m ON m.src_repo = t.model_repo "
                                      "JOIN checkpoints c ON c.repo = m.repo AND c.sha = t.model_sha"))
        conn.execute("CREATE OR REPLACE TEMP TABLE run_map AS SELECT t.run_id AS src, "
                     f"{run_id} AS dst, m.repo FROM tpl.score_runs t "
                     "JOIN lineage_map m ON m.src_repo = t.model_repo")
        docs = [c for c, _ in _columns(conn, "score_documents")]
        timed("score_documents", f"INSERT INTO score_documents ({', '.join(docs)}) SELECT "
              + ", ".join("r.dst" if c == "run_id" else f"t.{c}" for c in docs)
              + " FROM tpl.score_documents t JOIN run_map r ON r.src = t.run_id ORDER BY r.dst, t.rowid")
        # A poll carries no repo: each template poll is the one that discovered a checkpoint.
        timed("hub_polls", _copy_sql(conn, "hub_polls", {"id": None},
                                     "JOIN tpl.checkpoints c ON c.discovered_at = t.polled_at "
                                     "JOIN lineage_map m ON m.src_repo = c.repo",
                                     "ORDER BY t.polled_at + to_seconds(m.shift_s), m.j"))
        timed("predictions", _copy_sql(
            conn, "predictions", {"id": None, "run_id": "r.dst",
                                  "detail": "replace(replace(t.detail::VARCHAR, m.src_repo, m.repo), t.run_id, r.dst)"},
            "JOIN lineage_map m ON m.src_repo = t.lineage JOIN run_map r ON r.src = t.run_id AND r.repo = m.repo",
            "ORDER BY t.evaluated_at + to_seconds(m.shift_s), m.j, t.id"))
        # An alert's fingerprint hashes its labels: the template's label blob, renamed, hashed again.
        blobs = [(r[0], json.dumps(sorted(json.loads(r[1]).items()), separators=(",", ":")))
                 for r in conn.execute("SELECT id, labels FROM tpl.alerts ORDER BY id").fetchall()]
        for (_, blob), row in zip(blobs, conn.execute("SELECT labels, fingerprint FROM tpl.alerts ORDER BY id").fetchall()):
            if fingerprint(json.loads(row[0])) != row[1] or hashlib.sha256(blob.encode()).hexdigest()[:16] != row[1]:
                raise RuntimeError("alert fingerprints are no longer sha256 of the sorted label pairs: "
                                   "update bulk_state in benchmarks/scale_state.py")
        conn.execute("CREATE OR REPLACE TEMP TABLE fp_blob (id BIGINT, blob VARCHAR)")
        if blobs:
            conn.executemany("INSERT INTO fp_blob VALUES (?, ?)", blobs)
        timed("alerts", _copy_sql(
            conn, "alerts", {
                "id": None, "prediction_id": "pn.id",
                "fingerprint": "substr(sha256(replace(fb.blob, m.src_repo, m.repo)), 1, 16)",
                "numbers": "replace(replace(t.numbers::VARCHAR, m.src_repo, m.repo), "
                           "coalesce(tp.run_id, '\x00'), coalesce(r.dst, ''))"},
            "JOIN lineage_map m ON m.src_repo = t.lineage JOIN fp_blob fb ON fb.id = t.id "
            "LEFT JOIN tpl.predictions tp ON tp.id = t.prediction_id "
            "LEFT JOIN run_map r ON r.src = tp.run_id AND r.repo = m.repo "
            "LEFT JOIN predictions pn ON pn.policy = tp.policy AND pn.task = tp.task AND pn.run_id = r.dst",
            "ORDER BY t.created_at + to_seconds(m.shift_s), m.j, t.id"))
        # A copy's notification id derives from the template's id and the lineage.
        nid = "substr(md5(t.id || '/' || m.repo), 1, 8) || '-' || substr(md5(t.id || '/' || m.repo), 9, 24)"
        conn.execute(f"CREATE OR REPLACE TEMP TABLE notification_map AS SELECT DISTINCT t.id AS src, {nid} AS dst, "
                     "m.repo, m.src_repo, m.shift_s, m.j FROM tpl.notifications t "
                     "JOIN tpl.deliveries d ON d.notification_id = t.id "
                     "JOIN tpl.alerts a ON a.id = d.alert_id JOIN lineage_map m ON m.src_repo = a.lineage")
        timed("notifications", _copy_sql(
            conn, "notifications", {"id": "m.dst",
                                    "body": "replace(replace(t.body::VARCHAR, m.src_repo, m.repo), t.id, m.dst)"},
            "JOIN notification_map m ON m.src = t.id", "ORDER BY t.created_at + to_seconds(m.shift_s), m.j"))
        timed("deliveries", _copy_sql(
            conn, "deliveries", {"id": None, "alert_id": "an.id", "notification_id": "nm.dst"},
            "JOIN tpl.alerts ta ON ta.id = t.alert_id JOIN lineage_map m ON m.src_repo = ta.lineage "
            "JOIN alerts an ON an.alert_key = replace(ta.alert_key, m.src_repo, m.repo) "
            "LEFT JOIN notification_map nm ON nm.src = t.notification_id AND nm.repo = m.repo",
            "ORDER BY t.created_at + to_seconds(m.shift_s), m.j, t.id"))
        timed("delivery_attempts", _copy_sql(
            conn, "delivery_attempts", {"id": None, "notification_id": "m.dst"},
            "JOIN notification_map m ON m.src = t.notification_id",
            "ORDER BY t.started_at + to_seconds(m.shift_s), m.j, t.id"))
        timed("notification_groups", _copy_sql(
            conn, "notification_groups", {}, "JOIN lineage_map m ON t.group_key LIKE '%' || m.src_repo || '%'"))
        # the evaluation queue is drained: the scopes its ticks recorded, no queued run
        for name in ("hub_watermarks", "hub_state", "endpoints", "evaluation_scopes"):
            conn.execute(f"INSERT INTO {name} SELECT * FROM tpl.{name}")
    finally:
        for temp in ("lineage_map", "run_map", "fp_blob", "notification_map"):
            conn.execute(f"DROP TABLE IF EXISTS temp.{temp}")
        conn.execute("DETACH tpl")
    t0 = time.perf_counter()
    # the poller's idle listings over the retained window (what record_idle_polls writes)
    polls = int((retention / POLL_EVERY))
    with store.transaction() as c:
        c.execute("INSERT INTO hub_polls (rule_key, rule_name, polled_at, ok, listed, new_rows, requests, error) "
                  "SELECT 'bench-rule', 'bench', ?::TIMESTAMPTZ - to_seconds(k * ?), true, 0, 0, 1, NULL "
                  "FROM range(1, ?) r(k) ORDER BY k DESC",
                  [t_end, int(POLL_EVERY.total_seconds()), polls + 1])
    record_weekly_reports(store, t_end=t_end)
    timings["polls_reports"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    store.prune_logs(t_end - retention)
    timings["prune"] = time.perf_counter() - t0
    store.checkpoint()
    return timings


def build_template(folder: Path, *, n_lineages: int, t_end: datetime, per_lineage: int = PER_LINEAGE
                   ) -> Path:
    """The template database (lineages 0..SHAPES-1 of a state of `n_lineages`) at folder/template.duckdb."""
    from monitor.store import Store

    policies = write_policy(folder)
    path = Path(folder) / "template.duckdb"
    for p in (path, Path(str(path) + ".wal")):
        p.unlink(missing_ok=True)
    with Store.open(path) as store:
        build_api_state(store, load_bench_policy(policies), range(min(TEMPLATE_LINEAGES, n_lineages)),
                        n_lineages=n_lineages, t_end=t_end, per_lineage=per_lineage, retention=None)
    return path


def build_bulk(folder: Path, *, n_checkpoints: int, t_end: datetime | None = None,
               per_lineage: int = PER_LINEAGE) -> dict[str, Any]:
    """A state folder (policies/, state/lstar.duckdb) of about `n_checkpoints` checkpoints,
    bulk-loaded from an API-built template. Returns what was built and the time it took."""
    import time

    from monitor.store import Store

    t0 = time.perf_counter()
    folder = Path(folder)
    t_end = t_end or datetime.now(timezone.utc).replace(microsecond=0)
    n_lineages = max(TEMPLATE_LINEAGES, n_checkpoints // per_lineage)
    template = build_template(folder, n_lineages=n_lineages, t_end=t_end, per_lineage=per_lineage)
    t_template = time.perf_counter() - t0
    db = folder / "state" / "lstar.duckdb"
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    with Store.open(db) as store:
        timings = bulk_state(store, template, n_lineages=n_lineages, t_end=t_end, per_lineage=per_lineage)
        counts = store.info()["tables"]
    return {"n_lineages": n_lineages, "per_lineage": per_lineage, "t_end": t_end.isoformat(),
            "template_s": round(t_template, 2), "bulk_s": round(time.perf_counter() - t0 - t_template, 2),
            "insert_s": {k: round(v, 2) for k, v in timings.items()}, "rows": counts,
            "db_bytes": db.stat().st_size, "policies": str(folder / "policies"), "state": str(db.parent)}


# -- equality -------------------------------------------------------------------------------------
_UUIDISH = re.compile(r"[0-9a-f]{8}-[0-9a-f-]{20,}")
_ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(\+00:00|Z)?")
_BODY_HASHES = re.compile(r'"(fingerprint|run_id)": ?"[0-9a-f]+"')


def _mask(text: Any) -> Any:
    """A copied notification body keeps the template's times, alert fingerprints and run ids
    (rewriting them inside frozen JSON is not worth it for a benchmark): masked, with ids."""
    if not isinstance(text, str):
        return text
    return _BODY_HASHES.sub(r'"\1":"<hash>"', _ISO.sub("<time>", _UUIDISH.sub("<id>", text)))


# Per table: the rows with ids replaced by natural keys (so two states compare row for row).
COMPARE_SQL = {
    "checkpoints": "SELECT * EXCLUDE (id) FROM checkpoints",
    "score_runs": "SELECT r.* EXCLUDE (checkpoint_id), c.repo AS ck_repo, c.sha AS ck_sha FROM score_runs r "
                  "LEFT JOIN checkpoints c ON c.id = r.checkpoint_id",
    "score_documents": "SELECT * FROM score_documents",
    "corpora": "SELECT * EXCLUDE (registered_at) FROM corpora",
    "tokenizers": "SELECT * EXCLUDE (registered_at) FROM tokenizers",
    "hub_polls": "SELECT * EXCLUDE (id) FROM hub_polls",
    "predictions": "SELECT * EXCLUDE (id) FROM predictions",
    "alerts": "SELECT a.* EXCLUDE (id, prediction_id), p.task AS p_task, p.run_id AS p_run FROM alerts a "
              "LEFT JOIN predictions p ON p.id = a.prediction_id",
    "deliveries": "SELECT d.* EXCLUDE (id, alert_id, notification_id), a.alert_key, n.group_key AS n_group, "
                  "n.created_at AS n_created FROM deliveries d JOIN alerts a ON a.id = d.alert_id "
                  "LEFT JOIN notifications n ON n.id = d.notification_id",
    "notifications": "SELECT * EXCLUDE (id) FROM notifications",
    "delivery_attempts": "SELECT t.* EXCLUDE (id, notification_id), n.group_key, n.created_at AS n_created "
                         "FROM delivery_attempts t JOIN notifications n ON n.id = t.notification_id",
}
# Tables without ids or whose ids are natural keys: compared as they are.
for _table in ("checkpoint_bases", "evaluation_scopes", "evaluation_queue", "notification_groups", "hub_watermarks",
               "hub_state", "endpoints"):
    COMPARE_SQL[_table] = f"SELECT * FROM {_table}"
COMPARE_SQL["checkpoint_bases"] = ("SELECT b.* EXCLUDE (checkpoint_id), c.repo AS ck_repo, c.sha AS ck_sha "
                                   "FROM checkpoint_bases b JOIN checkpoints c ON c.id = b.checkpoint_id")
COMPARE_SQL["reports"] = "SELECT * EXCLUDE (id) FROM reports"


def table_shapes(store: Any) -> dict[str, tuple[int, tuple[str, ...]]]:
    """Every table of the store: its row count and its columns (what `compare_states` checks
    beyond the compared rows: no table, column or row kind missing from either state)."""
    out = {}
    for (table,) in store.conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' "
                                       "AND table_catalog = current_database() ORDER BY 1").fetchall():
        cols = tuple(c for c, _ in _columns(store.conn, table))
        out[table] = (store.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0], cols)
    return out


def state_rows(store: Any) -> dict[str, list[tuple]]:
    """Every compared table as a sorted list of rows (ids replaced, bodies masked)."""
    out = {}
    for table, sql in COMPARE_SQL.items():
        rows = store.conn.execute(sql).fetchall()
        out[table] = sorted((tuple(_mask(v) for v in row) for row in rows), key=repr)
    return out


def compare_states(a: Any, b: Any) -> dict[str, str]:
    """Tables whose rows differ between stores `a` and `b`, with the first difference each."""
    ra, rb = state_rows(a), state_rows(b)
    problems = {}
    sa, sb = table_shapes(a), table_shapes(b)
    for table in sorted(set(sa) | set(sb)):
        if table == "schema_migrations":
            continue
        if sa.get(table) != sb.get(table):
            problems[table] = f"rows, columns: {sa.get(table)} vs {sb.get(table)}"
    for table in COMPARE_SQL:
        if ra[table] != rb[table]:
            only_a = [r for r in ra[table] if r not in rb[table]]
            only_b = [r for r in rb[table] if r not in ra[table]]
            problems[table] = (f"{len(ra[table])} vs {len(rb[table])} rows; first only in the first: "
                               f"{only_a[:1]}; first only in the second: {only_b[:1]}")
    return problems


def json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
