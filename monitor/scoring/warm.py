"""A warm scoring worker: one child process that scores job after job, so that importing
torch and transformers (seconds) is paid once per worker, not once per job.

The parent (`monitor.scoring.backends.warm`) starts it under the same limits as a cold
scoring child (`limit_child`: the address-space limit, and death with the parent), hands it
one job at a time and bounds each job's time; the worker never opens the database. Between
jobs it keeps a `PrepareCache` (tokenizers, the tokenized corpus, unigram baselines).

Protocol: `python -m monitor.scoring.warm STATUS_FD`. The worker imports the scoring
libraries, then writes `{"ready": true, "pid": N}` as one line to the file descriptor
STATUS_FD. Each job is one line of JSON on stdin, `{"request", "baselines", "result"}`
(`result`: the file to write the outcome to, as `monitor.scoring.child` writes it); when the
file is in place the worker writes `{"done": RESULT}` to STATUS_FD. End of stdin ends it.
stdout and stderr carry only its log output (and faulthandler's traceback for a crash), so
what a model prints cannot be taken for an answer.

Fail points (`LSTAR_FAILPOINT`, crash tests), beside the scoring child's (`hang_score_child`,
`oom_score_child`, `segfault_score_child`, which act on every job): `kill_warm_worker=MARKER`
SIGKILLs the worker after it has taken a job and before it answers, once (the first job to
create the file MARKER dies; later ones run); `hang_warm_worker=MARKER` likewise sleeps for
ever instead of answering, once.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import signal
import sys
import time
from pathlib import Path

from monitor.environment import harden_environment
from monitor.failpoints import failpoint_values
from monitor.scoring.memory_limit import PROBE_MODULES


def _once(marker: str) -> bool:
    """Whether this is the first job to reach a fail point marked by the file `marker`."""
    if not marker:
        return True
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _job_failpoints() -> None:
    points = failpoint_values()
    if "kill_warm_worker" in points and _once(points["kill_warm_worker"]):
        os.kill(os.getpid(), signal.SIGKILL)
    if "hang_warm_worker" in points and _once(points["hang_warm_worker"]):
        while True:
            time.sleep(3600)


def warm_up() -> None:
    """Import what every job needs and start the math libraries' thread pools (one small
    matrix product), so the first job pays none of it."""
    for name in PROBE_MODULES:
        importlib.import_module(name)
    torch = sys.modules["torch"]
    torch.ones(64, 64) @ torch.ones(64, 64)


def main(argv: list[str] | None = None) -> int:
    """Worker entry point: warm up, then score the jobs read from stdin until it closes."""
    from monitor.scoring.child import _write_atomically, request_from_json, score_payload
    from monitor.scoring.process_cache import PrepareCache

    args = sys.argv[1:] if argv is None else argv
    status = os.fdopen(int(args[0]), "w", buffering=1, encoding="utf-8")
    faulthandler.enable()
    harden_environment()
    try:
        warm_up()
    except Exception:  # noqa: BLE001, S110 (the job says why: its own imports fail the same way)
        pass
    status.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    cache = PrepareCache()
    for line in sys.stdin:
        if not line.strip():
            continue
        envelope = json.loads(line)
        request = request_from_json(json.dumps(envelope["request"]))
        given = [(str(fp), str(sha), dict(b)) for fp, sha, b in envelope.get("baselines") or ()]
        _job_failpoints()
        payload = score_payload(request, cache.baselines(given), cache=cache)
        if payload.get("ok"):
            row = payload["run_row"]
            cache.remember_baseline(row["tokenizer_fingerprint"], row["corpus_sha256"], payload.get("baseline"))
        _write_atomically(Path(envelope["result"]), payload)
        status.write(json.dumps({"done": envelope["result"]}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
