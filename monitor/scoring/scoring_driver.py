"""Driving the scoring queue: lease a gated checkpoint, fetch it verified, score it, complete it.

The queue (`monitor.hub.queue`) gives each job a lease and at most three attempts.
`score_queue` downloads the pinned snapshot (recording the fetch), hands it to a scorer,
and writes the score run and the lease's completion in one transaction, so a job completes
exactly once; `score_in_process` runs the forward passes here (`lstar score --pending`).

`score_queue_on` (the daemon's path) leases a batch of jobs, fetches each, and hands them
together to a scoring backend (`monitor.scoring.backends`: `local` child processes, or a
Ray cluster that runs them in parallel); each outcome is written with its lease's
completion as it arrives. Workers never open the database (and the local backend's child
process cannot take the daemon down with a model that eats all memory or never finishes);
the cached unigram baselines travel with the jobs, and a baseline a worker computed comes
back to be cached.

Identical content is scored once: a fetched checkpoint whose weights and config/tokenizer
files (by the digests the fetch recorded from the Hub's LFS sha256 and blob ids), scoring
options and corpus selection match an earlier run is not handed to the backend; its score
is a copy of that run, linked to it in `score_digests` (and named in the run's `model`).

After a run that finished jobs, the daemon prunes the Hub cache (`prune_after_scoring`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from monitor import SCORING_SPEC_VERSION
from monitor.errors import HubError, LstarError
from monitor.failpoints import failpoint
from monitor.hub import (DEFAULT_LEASE_S, HubClient, JobResult, LayoutError, Outcome, fetch_job,
                         process_pending, prune_cache, resolve_cache_dir)
from monitor.hub.fetch import adapter_facts
from monitor.hub.queue import claim_batch, release, settle
from monitor.scoring import ScoredRun, ScoreRequest, compute_score, prepare
from monitor.scoring.backends import ScoreJob, ScoreOutcome, ScoringBackend, estimate_memory
from monitor.scoring.engine import corpus_selection
from monitor.scoring.loader import checkpoint_hash
from monitor.scoring.precision import canonical_dtype, host_precision
from monitor.store import Store, utcnow
from monitor.store.rows import CheckpointRow, ScoredRunRef

log = logging.getLogger("lstar.daemon")

# A scorer turns a leased job and its verified snapshot into a score run (not yet written).
Scorer = Callable[[CheckpointRow, Path], ScoredRun]


def score_queue(store: Store, client: HubClient | None, scorer: Scorer, *, owner: str,
                cache_dir: Path | None = None, lease_s: float = DEFAULT_LEASE_S, limit: int | None = None,
                now_fn: Callable[[], datetime] = utcnow,
                stopping: Callable[[], bool] | None = None) -> list[JobResult]:
    """Fetch and score queued checkpoints, each job exactly once; returns what happened to each.

    With `stopping` given and true before a job starts, the job's lease and attempt go back
    and the run ends (it runs after the restart).
    """
    def worker(job: CheckpointRow) -> Outcome:
        if stopping is not None and stopping():
            raise HubError("the daemon stopped before this job started", hint="it runs after the restart")
        snapshot = fetch_job(store, job, owner=owner, client=client, cache_dir=cache_dir, now_fn=now_fn)
        scored = scorer(job, snapshot)
        failpoint("mid_score")
        result = scored.result
        return Outcome("scored", meta={"run_id": result["run_id"], "lstar": result["lstar"],
                                       "se": result["se_ce"], "corpus_sha256": result["corpus"]["sha256"]},
                       write=lambda conn: scored.write(store, conn))

    return process_pending(store, worker, owner=owner, now_fn=now_fn, lease_s=lease_s, limit=limit)


def _hub_info(job: CheckpointRow) -> dict[str, Any]:
    info: dict[str, Any] = {"repo": job.repo, "sha": job.sha, "source": "hub"}
    adapter = adapter_facts(job)
    if adapter is not None:   # the score records both commits: the adapter's and its base's
        info["base"] = {"repo": adapter["base_repo"], "sha": adapter["base_sha"], "relation": "adapter"}
    return info


def base_snapshot(job: CheckpointRow, snapshot: Path) -> Path | None:
    """For an adapter job, the verified snapshot of its pinned base (fetched beside the
    adapter's in the same cache by `fetch_job`); None for a model."""
    from monitor.hub.fetch import snapshot_dir

    adapter = adapter_facts(job)
    if adapter is None:
        return None
    return snapshot_dir(snapshot.parent.parent.parent, adapter["base_repo"], adapter["base_sha"])


def score_in_process(store: Store, template: ScoreRequest) -> Scorer:
    """Score in this process with the spec of `template`."""
    def scorer(job: CheckpointRow, snapshot: Path) -> ScoredRun:
        # snapshots/<sha>/ links into the repo's blobs/: both live under the repo cache folder
        base = base_snapshot(job, snapshot)
        model = base if base is not None else snapshot
        request = replace(template, model=str(model), checkpoint_id=job.id,
                          model_root=model.parent.parent,
                          adapter=snapshot if base is not None else None,
                          adapter_root=snapshot.parent.parent if base is not None else None,
                          extra_model_info={**_hub_info(job), "path": str(snapshot)})
        return compute_score(prepare(request), store)

    return scorer


def absolute_paths(template: ScoreRequest) -> ScoreRequest:
    """The request with every path made absolute: a worker may run in another directory."""
    def resolved(path: Path | None) -> Path | None:
        return Path(path).expanduser().resolve() if path is not None else None

    return replace(template, corpus_dir=resolved(template.corpus_dir),  # type: ignore[arg-type]
                   tokenizer_dir=resolved(template.tokenizer_dir),
                   reference_tokenizer=resolved(template.reference_tokenizer), progress=False)


def resolved_precision(template: ScoreRequest, *, workers_here: bool = True) -> ScoreRequest:
    """The request with `auto` device and dtype resolved for this machine's workers
    (`scoring.precision.host_precision`); with workers elsewhere, only a CPU device resolves."""
    if workers_here or template.device == "cpu":
        got = host_precision(template.dtype, template.device)
        return replace(template, dtype=got.dtype, device=got.device)
    return replace(template, dtype=canonical_dtype(template.dtype))


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


class JobBuilder:
    """Turns a leased, fetched checkpoint into a self-contained `ScoreJob`.

    The corpus selection is read once per batch (its sha256 is what every score must be
    of); the baselines the store has for it go with each job.
    """

    def __init__(self, store: Store, template: ScoreRequest, state_dir: Path,
                 plan_for: Callable[[CheckpointRow], dict[str, Any]] | None = None, *,
                 workers_here: bool = True) -> None:
        self.store = store
        # `auto` resolved once (`scoring.precision`): the memory estimate, the workers' load and
        # the request digest all name the precision scored in. Workers elsewhere (Ray) resolve
        # `auto` on their own hardware; only a CPU device is known here then.
        self.template = resolved_precision(absolute_paths(template), workers_here=workers_here)
        # Sequential scoring: the plan (tasks to settle) of each job, else None (full scores).
        self.plan_for = plan_for
        self.state_dir = state_dir
        self._corpus_sha: str | None = None
        self._request_digest: str | None = None

    def corpus_sha256(self) -> str:
        if self._corpus_sha is None:
            self._corpus_sha = corpus_selection(self.template).sha256
        return self._corpus_sha

    def request_digest(self) -> str:
        """sha256 of what changes a number besides the checkpoint: the scoring options, the
        override tokenizers' contents (not where they are: a folder edited in place is another
        tokenizer) and the versions of the libraries that compute the forward pass."""
        if self._request_digest is None:
            t = self.template
            options = {"spec": SCORING_SPEC_VERSION, "max_context": t.max_context, "stride": t.stride,
                       "disjoint": t.disjoint, "docs": t.docs, "slices": t.slices, "every": t.every,
                       "dtype": t.dtype, "device": t.device, "batch_size": t.batch_size, "with_tcb": t.with_tcb,
                       "tcb_positions": t.tcb_positions, "n_boot": t.n_boot, "seed": t.seed,
                       "tokenizer": checkpoint_hash(t.tokenizer_dir) if t.tokenizer_dir else None,
                       "reference_tokenizer": checkpoint_hash(t.reference_tokenizer) if t.reference_tokenizer
                       else None,
                       "libraries": {name: _version(name) for name in ("torch", "transformers", "tokenizers")}}
            if self.plan_for is not None:   # a partial score is no stand-in for a full one
                options["scoring"] = "sequential"
            self._request_digest = hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()
        return self._request_digest

    def content_key(self, checkpoint_id: int) -> dict[str, str] | None:
        """What a score of this fetched checkpoint would measure: its weights and files digests
        (recorded by the fetch), the scoring options and the corpus selection; None when the
        Hub gave no content hash for some file, or the precision is left to the workers
        (`auto` on Ray: a bf16 and a float32 score are not the same number), so it is always scored."""
        if self.template.dtype == "auto":
            return None
        row = self.store.get_checkpoint(checkpoint_id)
        meta = (row.meta if row is not None else None) or {}
        if not meta.get("weights_digest") or not meta.get("files_digest"):
            return None
        return {"weights_digest": meta["weights_digest"], "files_digest": meta["files_digest"],
                "request_digest": self.request_digest(), "corpus_sha256": self.corpus_sha256()}

    def build(self, job: CheckpointRow, snapshot: Path) -> tuple[ScoreJob, Path]:
        """The job, and the flat copy of its snapshot (removed by the caller when done)."""
        corpus_sha = self.corpus_sha256()
        flat = self.state_dir / "tmp" / f"checkpoint-{job.id}"
        base = base_snapshot(job, snapshot)
        try:
            adapter = None
            if base is None:
                model_dir = materialize_snapshot(snapshot, flat)
            else:   # the adapter beside its base, both flat: the child merges them
                shutil.rmtree(flat, ignore_errors=True)
                adapter = materialize_snapshot(snapshot, flat / "adapter")
                model_dir = materialize_snapshot(base, flat / "model")
            request = replace(self.template, model=str(model_dir), checkpoint_id=job.id, adapter=adapter,
                              extra_model_info={**_hub_info(job), "files_sha256_dir": str(snapshot)},
                              sequential=self.plan_for(job) if self.plan_for is not None else None)
            try:
                memory = estimate_memory(model_dir, dtype=request.dtype, device=request.device)
            except (LayoutError, OSError):
                memory = None   # the loader refuses such a checkpoint with the reason
            score_job = ScoreJob(checkpoint_id=job.id, repo=job.repo, sha=job.sha, request=request,
                                 corpus_sha256=corpus_sha, memory_bytes=memory,
                                 baselines=tuple(self.store.baselines_for_corpus(corpus_sha)))
        except BaseException:
            shutil.rmtree(flat, ignore_errors=True)   # no job will remove it
            raise
        return score_job, flat


def _raising(exc: BaseException) -> Callable[[], Outcome]:
    def work() -> Outcome:
        raise exc
    return work


def outcome_to_queue(store: Store, outcome: ScoreOutcome, key: dict[str, str] | None = None) -> Outcome:
    """A backend's outcome as the queue's: the score's rows to write (with its content key,
    so a later job with the same weights links to it), or its error raised."""
    if outcome.error is not None and outcome.error.error_class == "ScoringInterrupted":
        # Killed by our own shutdown: the lease and the attempt go back.
        raise HubError(f"the daemon stopped while scoring this job ({outcome.error.message})",
                       hint="it runs after the restart")
    scored = outcome.unwrap()
    failpoint("mid_score")
    result = scored.result
    if key is not None and key["corpus_sha256"] != result["corpus"]["sha256"]:
        key = None  # not what was asked for (the check in the backend refuses this already)

    def write(conn) -> None:
        scored.write(store, conn)
        if key is not None:
            store.insert_score_digest(conn, result["run_id"], outcome.job.checkpoint_id, key)

    return Outcome("scored", meta={"run_id": result["run_id"], "lstar": result["lstar"],
                                   "se": result["se_ce"], "corpus_sha256": result["corpus"]["sha256"],
                                   "tokens_per_s": result.get("tokens_per_s"),
                                   "baseline": scored.baseline_source,
                                   **({"worker": outcome.worker} if outcome.worker else {})},
                   write=write)


def linked_outcome(store: Store, job: CheckpointRow, source: ScoredRunRef, key: dict[str, str],
                   now_fn: Callable[[], datetime]) -> Outcome:
    """The job's score as a copy of `source`, a run that measured the same weights, files,
    options and corpus: no forward pass; the new run names the one it was copied from."""
    run = store.score_run(source.run_id)
    if run is None:
        raise RuntimeError(f"score run {source.run_id} vanished before it could be linked")
    run_id = uuid.uuid4().hex
    log.info("%s@%s has the same weights and files as checkpoint %s: score linked to run %s",
             job.repo, str(job.sha)[:12], source.checkpoint_id, source.run_id[:8])
    return Outcome("scored", meta={"run_id": run_id, "lstar": run.lstar, "se": run.se_ce,
                                   "corpus_sha256": run.corpus_sha256,
                                   "linked_from_run_id": source.run_id,
                                   "linked_from_checkpoint_id": source.checkpoint_id},
                   write=lambda conn: store.link_score_run(conn, source, run_id=run_id, checkpoint=job, key=key,
                                                           now=now_fn()))


def _give_back(store: Store, job: CheckpointRow, owner: str, reason: str,
               now_fn: Callable[[], datetime]) -> JobResult:
    """Return a job's lease and its attempt: it did not run, through no fault of its own."""
    held = release(store, job.id, owner, reason, now=now_fn(), refund=True) is not None
    row = store.get_checkpoint(job.id)
    status, why = (row.status, row.reason) if row is not None else ("gone", None)
    return JobResult(job.id, job.repo, job.sha, job.attempts, status, why, lease_lost=not held, refunded=True)


@dataclass
class _Batch:
    """One call's leased jobs on their way through: built and handed to the backend (`ready`
    by checkpoint id, `jobs` in order), or waiting on an earlier job of this batch with the same
    content (`followers`, by their `leaders`); `results` holds each job's result as it settles."""
    store: Store
    owner: str
    now_fn: Callable[[], datetime]
    results: list[JobResult] = field(default_factory=list)
    ready: dict[int, tuple[CheckpointRow, Path, dict[str, str] | None]] = field(default_factory=dict)
    jobs: list[ScoreJob] = field(default_factory=list)
    leaders: dict[tuple[str, ...], int] = field(default_factory=dict)
    followers: list[tuple[CheckpointRow, dict[str, str], int]] = field(default_factory=list)

    def settle_with(self, job: CheckpointRow, work: Callable[[], Outcome]) -> bool:
        """Complete the job with what `work` returns (or raises); True when the Hub is down."""
        result, down = settle(self.store, job, self.owner, work, now_fn=self.now_fn)
        self.results.append(result)
        return down

    def give_back(self, job: CheckpointRow, reason: str) -> None:
        self.results.append(_give_back(self.store, job, self.owner, reason, self.now_fn))

    def link(self, job: CheckpointRow, source: ScoredRunRef, key: dict[str, str]) -> None:
        """Complete the job as a copy of `source`, a score of the same content: no forward pass."""
        self.settle_with(job, lambda: linked_outcome(self.store, job, source, key, self.now_fn))

    def prepare(self, claimed: list[CheckpointRow], builder: JobBuilder, *, client: HubClient | None,
                cache_dir: Path | None, stopping: Callable[[], bool] | None) -> None:
        """Fetch each claimed job, then link it to an earlier score of the same content, set it
        to follow an earlier job of this batch, or build it for the backend. Once the Hub is down
        or the daemon stops, the jobs not started go back."""
        hub_down = False
        for job in claimed:
            if hub_down or (stopping is not None and stopping()):
                why = "the Hub is down" if hub_down else "the daemon stopped before this job started"
                self.give_back(job, f"waiting: {why}")
                continue
            try:
                snapshot = fetch_job(self.store, job, owner=self.owner, client=client, cache_dir=cache_dir,
                                     now_fn=self.now_fn)
                key = builder.content_key(job.id)
                source = self.store.scored_run_with(key) if key is not None else None
                if source is None and key is not None and tuple(key.values()) in self.leaders:
                    self.followers.append((job, key, self.leaders[tuple(key.values())]))
                    continue
                if source is None:
                    score_job, flat = builder.build(job, snapshot)
            except Exception as exc:  # settle classifies it: retry, fail, skip, or the Hub is down
                hub_down = self.settle_with(job, _raising(exc))
                continue
            if source is not None:   # the same content was scored before: link, no forward pass
                self.link(job, source, key)
                continue
            if key is not None:
                self.leaders[tuple(key.values())] = job.id
            self.ready[job.id] = (job, flat, key)
            self.jobs.append(score_job)

    def score_ready(self, backend: ScoringBackend) -> None:
        """Score the built jobs together, each outcome written as it arrives; when the backend
        itself fails (a lost cluster: not the jobs' fault) the jobs still waiting go back."""
        try:
            for outcome in backend.run(self.jobs):
                job, flat, key = self.ready.pop(outcome.job.checkpoint_id)  # type: ignore[arg-type]
                shutil.rmtree(flat, ignore_errors=True)
                self.settle_with(job, lambda outcome=outcome, key=key: outcome_to_queue(self.store, outcome, key))
        except Exception as exc:
            reason = f"the scoring backend failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            log.warning("%s; %d job(s) go back to the queue", reason, len(self.ready))
            for job, flat, _ in list(self.ready.values()):
                shutil.rmtree(flat, ignore_errors=True)
                self.give_back(job, reason)
            self.ready.clear()

    def link_followers(self) -> None:
        """Link each follower to its leader's new score; one whose leader was not scored waits
        and runs on its own next time."""
        for job, key, leader in self.followers:
            source = self.store.scored_run_with(key)
            if source is None:
                self.give_back(job, f"waiting: checkpoint {leader} has the same weights and was not scored in "
                               "this run")
            else:
                self.link(job, source, key)

    def remove_flat_copies(self) -> None:
        """The flat copies of jobs never scored (an interrupted call): no job will remove them."""
        for _, flat, _ in self.ready.values():
            shutil.rmtree(flat, ignore_errors=True)


def _wait_for_corpus(store: Store, builder: JobBuilder, claimed: list[CheckpointRow], owner: str,
                     now_fn: Callable[[], datetime]) -> list[JobResult] | None:
    """None when the daemon's scoring corpus reads; else every claimed job given back with why.

    The daemon's own corpus (an unmounted share, a file edited in place) is not the jobs'
    fault: they wait, attempts untouched, with the reason, until it is mended."""
    try:
        builder.corpus_sha256()
    except (LstarError, OSError) as exc:
        reason = f"waiting: the daemon's scoring corpus is unusable: {' '.join(str(exc).split())[:300]}"
        log.error("%s; %d job(s) go back to the queue", reason, len(claimed))
        return [_give_back(store, job, owner, reason, now_fn) for job in claimed]
    return None


def score_queue_on(store: Store, client: HubClient | None, backend: ScoringBackend, template: ScoreRequest,
                   *, owner: str, state_dir: Path, cache_dir: Path | None = None,
                   lease_s: float = DEFAULT_LEASE_S, limit: int | None = None,
                   now_fn: Callable[[], datetime] = utcnow,
                   stopping: Callable[[], bool] | None = None,
                   plan_for: Callable[[CheckpointRow], dict[str, Any]] | None = None) -> list[JobResult]:
    """Lease up to `limit` queued checkpoints, fetch them, score them together on `backend`.

    With `plan_for` each job is scored sequentially, until the tasks of its plan are settled.

    Each outcome is written with its lease's completion as it arrives, so a job completes
    exactly once whatever the backend does; a job whose worker died goes back to the queue
    (at most three attempts in all). When the Hub goes down or the daemon stops before a
    job is handed over, that job's lease and attempt go back.
    """
    claimed = claim_batch(store, owner, now_fn=now_fn, lease_s=lease_s, limit=limit)
    builder = JobBuilder(store, template, state_dir, plan_for,
                         workers_here=getattr(backend, "name", "local") == "local")
    if claimed:
        waiting = _wait_for_corpus(store, builder, claimed, owner, now_fn)
        if waiting is not None:
            return waiting
    batch = _Batch(store, owner, now_fn)
    try:
        batch.prepare(claimed, builder, client=client, cache_dir=cache_dir, stopping=stopping)
        batch.score_ready(backend)
        batch.link_followers()
    finally:
        batch.remove_flat_copies()
    store.checkpoint()
    return batch.results


def prune_after_scoring(store: Store, *, cache_dir: Path | None, keep_last: int | None,
                        max_bytes: int | None) -> None:
    """Prune the Hub cache to `keep_last` / `max_bytes` (no pruning when `keep_last` is None);
    a failure is logged, not raised."""
    if keep_last is None:
        return
    try:
        report = prune_cache(store, resolve_cache_dir(cache_dir), keep_last=keep_last, max_bytes=max_bytes)
    except OSError as exc:
        log.warning("pruning the Hub cache failed (retried after the next scoring run): %s", exc)
        return
    if report.removed:
        log.info("pruned the Hub cache: removed %d checkpoint(s), %d bytes freed; kept %s",
                 len(report.removed), report.freed_bytes, ", ".join(report.kept) or "none")


def materialize_snapshot(snapshot: Path, dest: Path) -> Path:
    """The verified snapshot as a self-contained folder of regular files.

    A Hub cache snapshot is links into `blobs/`, which the loader refuses (nothing it loads
    may resolve outside the checkpoint folder). Hard links cost no space; across file
    systems the files are copied.
    """
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for entry in sorted(snapshot.rglob("*")):
        if entry.is_dir():
            continue
        target = dest / entry.relative_to(snapshot)
        target.parent.mkdir(parents=True, exist_ok=True)
        real = entry.resolve()
        try:
            os.link(real, target)
        except OSError:
            shutil.copyfile(real, target)
    return dest
