"""How lstar holds up as its state grows: every daemon job, list read, API endpoint and report
on states of 10^3, 10^4 and 10^5 checkpoints (issue 26).

    python benchmarks/scale.py --sizes 1000,10000,100000 --out benchmarks/out/scale

Per size it builds a state that looks like a year of the daemon's writing
(benchmarks/scale_state.py: 20 checkpoints per lineage, one every 18 days, the lineages
staggered so that a week's runs fall into ~39 % of them; a ~2 KB gate/fetch/score meta per
checkpoint; every 20th lineage a fine-tune with its `checkpoint_bases` row; 50 document rows
per score; predictions for two tasks whose alerts fire, resolve and flap, grouped and sent
by the real outbox; the evaluation queue drained with its scopes; an idle poll every 15
minutes; 51 weekly reports), bulk-copied from a template written through the store's own
functions, then measures, each in its own subprocess (wall and CPU seconds, and peak RSS
from `wait4`; a daemon job's CPU is its own, an endpoint's the daemon's while it answered):

- each daemon job with nothing new, run in-process on a `Daemon` opened on the state
  (evaluate, dispatch, gate, prune, discovery, report), and evaluate + dispatch after 100
  new scores (on a copy of the state);
- each list command (`lstar checkpoints`, `runs`, `alerts list`, `status`, `db info`) and the
  report in each format (`--json`, `--markdown`, `--html`) for the policy's week;
- a daemon (`lstar run`, no watch rules, so it only evaluates, dispatches and reports):
  its start, each API endpoint (time and bytes), its peak RSS, and SIGTERM to exit.

Every step has a timeout (`--step-timeout`, default 150 s): a slow step is reported as
"> 150 s" and the benchmark goes on. It prints a table with the issue's targets beside the
numbers, and each one's growth per decade of checkpoints (from CPU seconds), and writes everything to OUT/scale-STAMP.json (and .md).

`--check-equal N` first builds N lineages through the API and by the bulk loader and
compares them row for row (what tests/test_scale_bench.py does at a tiny size).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import scale_state as ss

JOBS = ("evaluate", "dispatch", "gate", "prune", "discovery", "report")
LISTS = {"checkpoints": ["checkpoints"], "checkpoints --json": ["checkpoints", "--json"],
         "runs": ["runs"], "alerts list": ["alerts", "list"], "status": ["status"], "db info": ["db", "info"]}
REPORTS = {"report --json": ["--json"], "report --markdown": ["--markdown"], "report --html": ["--html", "{tmp}/r.html"]}
ENDPOINTS = ("/health", "/metrics", "/status", "/db/info", "/checkpoints?limit=1000", "/runs", "/alerts", "/silences",
             "/report?policy=bench", "/report/latest")
DRAIN_S = 60.0


def env() -> dict[str, str]:
    """The children's environment: this worktree's `monitor` first. (No HF_HUB_OFFLINE: the
    daemon refuses to start with it; nothing here reaches a real Hub, its endpoint is
    127.0.0.1:9 and the policy has no watch rules.)"""
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join([str(ROOT), out.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out["COLUMNS"] = "160"
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        out.pop(name, None)
    return out


# Runs argv[2:] and writes its wall time, peak RSS (wait4) and exit status to argv[1]. A
# child's ru_maxrss starts at its parent's RSS at fork time, so the measured command is
# forked from this small launcher rather than from the benchmark (which holds a state's worth).
LAUNCHER = """import json, os, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    json.dump({"wall_s": time.perf_counter() - t0, "maxrss_kb": usage.ru_maxrss,
               "cpu_s": usage.ru_utime + usage.ru_stime,
               "rc": os.waitstatus_to_exitcode(status)}, f)
"""


def run_measured(cmd: list[str], *, timeout: float) -> dict[str, Any]:
    """Run `cmd`, killing it after `timeout`; wall seconds, peak RSS (MB, from wait4), exit
    code, stdout bytes, and stdout's last line (a child's JSON)."""
    import tempfile

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile(suffix=".json") as usage_file:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, usage_file.name, *cmd], stdout=out, stderr=err,
                                env=env(), cwd=ROOT, start_new_session=True)
        timed_out = False
        peak = None
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            peak = child_peak_mb(proc.pid)   # the launcher dies too: the peak so far, from /proc
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        wall = time.perf_counter() - t0
        try:
            usage = json.loads(Path(usage_file.name).read_text() or "{}")
        except ValueError:
            usage = {}
        out.seek(0)
        data = out.read()
        err.seek(0)
        tail = err.read()[-600:].decode(errors="replace")
    lines = data.decode(errors="replace").strip().splitlines()
    rc = usage.get("rc", proc.returncode)
    return {"wall_s": round(usage.get("wall_s", wall), 3),
            "cpu_s": round(usage["cpu_s"], 3) if "cpu_s" in usage else None,
            "rss_mb": round(usage["maxrss_kb"] / 1024, 1) if "maxrss_kb" in usage else peak,
            "rc": rc, "timed_out": timed_out, "timeout_s": timeout, "stdout_bytes": len(data),
            "last_line": lines[-1] if lines else "", "stderr_tail": tail if rc else ""}


# -- in the child: one daemon job ---------------------------------------------------------------------
def child_job(args: argparse.Namespace) -> None:
    """Open a Daemon on the state as `lstar run` does, run one job, print its seconds as JSON."""
    from monitor.service.daemon import Daemon, DaemonConfig
    from monitor.store import Store
    from monitor.store.connection import utcnow

    cfg = DaemonConfig(policies_dir=Path(args.policies), state_dir=Path(args.state),
                       endpoint="http://127.0.0.1:9", cache_dir=Path(args.state) / "cache")
    daemon = Daemon(cfg)
    daemon.store = Store.open(cfg.db_path)
    daemon._reload_policies(force=True)
    if args.add:
        # new scores, through the store calls the scoring job makes (not yet evaluated)
        policy = daemon.policies()[0]
        n_lineages = daemon.store.query("SELECT count(DISTINCT lineage) AS n FROM checkpoints")[0]["n"]
        now = utcnow()
        t0 = time.perf_counter()
        for k in range(args.add):
            j = (k * n_lineages) // args.add
            ss.record_checkpoint(daemon.store, policy, ss.repo_name(j), 1000 + k, ss.lstar_of(j, k % 20),
                                 now - timedelta(minutes=args.add - k), evaluate=False)
        daemon.store.close()
        print(json.dumps({"seconds": time.perf_counter() - t0, "added": args.add}))
        return
    name = args.job
    first_tick = None
    if name == "evaluate" and not args.then_dispatch:
        # A bulk-loaded state has no evaluation scopes yet: the first tick scans every run once
        # (as after an upgrade or a changed curve pin) and records them; the daemon's every
        # later tick with nothing new is the second one, which is what the target is about.
        t_first = time.perf_counter()
        daemon.job_evaluate()
        first_tick = time.perf_counter() - t_first
    t0 = time.perf_counter()
    c0 = time.process_time()
    if name in ("evaluate", "dispatch", "prune", "report"):
        result = getattr(daemon, f"job_{name}")()
    elif name == "gate":
        from monitor.hub.gate import gate_pending
        with daemon.job_store() as store:
            result = gate_pending(store, daemon.hub_client(store), daemon.watch_rules(), cache_dir=cfg.cache_dir)
    elif name == "discovery":
        # A re-listing that finds nothing new: the newest 100 checkpoints, as the poller records them.
        from monitor.hub.poll import Candidate
        with daemon.job_store() as store:
            rows = store.query("SELECT repo, sha, refs FROM checkpoints ORDER BY discovered_at DESC LIMIT 100")
            cands = [Candidate(r["repo"], r["sha"], tuple(json.loads(r["refs"])), meta={}) for r in rows]
            result = store.record_discoveries("bench-rule", "bench", "http://hub.invalid", cands, watermark=None,
                                              boundary=[], now=utcnow(), requests=1, listed=len(cands))
    else:
        raise SystemExit(f"unknown job {name!r}")
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - c0
    second = None
    if args.then_dispatch:   # the outbox's grouping of what evaluation raised
        t1 = time.perf_counter()
        daemon.job_dispatch()
        second = time.perf_counter() - t1
    daemon.store.close()
    print(json.dumps({"seconds": seconds, "cpu_s": cpu, "dispatch_after_s": second, "first_tick_s": first_tick,
                      "result": ss.json_safe(summarise(result))}))


def summarise(result: Any) -> Any:
    if isinstance(result, dict):
        return {k: (len(v) if isinstance(v, (list, dict)) else v) for k, v in result.items()}
    if isinstance(result, list):
        return len(result)
    return result


# -- in the parent ----------------------------------------------------------------------------------
def lstar(*args: str) -> list[str]:
    return [sys.executable, "-m", "monitor.cli", *args]


def copy_state(state: Path, dest: Path) -> Path:
    """A copy of the state's database in `dest` (for a measurement that writes to it)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for f in state.glob("lstar.duckdb*"):
        shutil.copy2(f, dest / f.name)
    return dest


def measure_jobs(state: Path, policies: Path, timeout: float, results: dict[str, Any], tmp: Path) -> None:
    for job in JOBS:
        # The report job records the report it wrote, which would shorten the CLI's report
        # window and make the daemon's report not due: it runs on a copy.
        where = copy_state(state, tmp / "report-state") if job == "report" else state
        r = run_measured([sys.executable, __file__, "_job", job, "--state", str(where), "--policies",
                          str(policies)], timeout=timeout)
        results[f"job {job}"] = with_child_seconds(r)
        say(f"job {job}", results[f"job {job}"])
        if where != state:
            shutil.rmtree(where, ignore_errors=True)


def measure_new(state: Path, policies: Path, timeout: float, results: dict[str, Any], tmp: Path) -> None:
    copy = copy_state(state, tmp / "new-state")
    added = run_measured([sys.executable, __file__, "_job", "add", "--add", "100", "--state", str(copy),
                          "--policies", str(policies)], timeout=max(timeout, 600))
    results["new scores written"] = with_child_seconds(added)
    say("100 new: written (API)", added)
    r = run_measured([sys.executable, __file__, "_job", "evaluate", "--then-dispatch", "--state", str(copy),
                      "--policies", str(policies)], timeout=timeout)
    results["new evaluate"] = with_child_seconds(r)
    say("100 new: evaluate", results["new evaluate"])
    shutil.rmtree(copy, ignore_errors=True)


def with_child_seconds(r: dict[str, Any]) -> dict[str, Any]:
    try:
        child = json.loads(r["last_line"])
    except (ValueError, TypeError):
        child = {}
    r.update(seconds=child.get("seconds"), child=child)
    if child.get("cpu_s") is not None:   # the job's own CPU, not the child's start-up
        r["cpu_s"] = round(child["cpu_s"], 3)
    for key in ("dispatch_after_s", "first_tick_s"):
        if child.get(key) is not None:
            r[key] = child[key]
    return r


def measure_cli(state: Path, policies: Path, timeout: float, results: dict[str, Any], tmp: Path) -> None:
    base = run_measured(lstar("--version"), timeout=timeout)
    results["cli start"] = base
    say("cli start (--version)", base)
    for name, args in LISTS.items():
        r = run_measured(lstar(*args, "--state", str(state)), timeout=timeout)
        results[f"list {name}"] = r
        say(f"lstar {name}", r)
    for name, args in REPORTS.items():
        args = [a.format(tmp=tmp) for a in args]
        r = run_measured(lstar("report", "--policy", str(policies / "bench.yaml"), "--state", str(state), *args),
                         timeout=timeout)
        if "--html" in args and (tmp / "r.html").exists():
            r["stdout_bytes"] = (tmp / "r.html").stat().st_size
        results[name] = r
        say(f"lstar {name}", r)


def child_peak_mb(launcher: int) -> float | None:
    """Peak RSS so far of the command a launcher runs (its child), MB; None if unknown."""
    try:
        children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    except OSError:
        return None
    return vm_hwm_mb(int(children[0])) if children else None


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a running process so far (Linux /proc/PID/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vm_hwm_mb(pid: int) -> float | None:
    """Peak RSS of a running process (Linux /proc VmHWM), MB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def measure_daemon(state: Path, policies: Path, timeout: float, results: dict[str, Any]) -> None:
    """`lstar run` on the state: start, each endpoint, peak RSS, SIGTERM to exit."""
    import httpx

    info = state / "daemon.json"
    info.unlink(missing_ok=True)
    log = open(state / "bench-daemon.log", "wb")  # noqa: SIM115 - closed in the finally below
    cmd = lstar("run", "--policies", str(policies), "--state", str(state), "--api-port", "0",
                "--endpoint", "http://127.0.0.1:9", "--max-context", str(ss.SPEC["window_len"]),
                "--corpus", str(state / "no-corpus"), "--drain", f"{int(DRAIN_S)}s")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env(), cwd=ROOT)
    try:
        while not info.exists() and proc.poll() is None and time.perf_counter() - t0 < timeout:
            time.sleep(0.05)
        if not info.exists():
            results["daemon start"] = {"wall_s": round(time.perf_counter() - t0, 3), "rc": proc.poll(),
                                       "timed_out": proc.poll() is None, "timeout_s": timeout,
                                       "log_tail": (state / "bench-daemon.log").read_text()[-800:]}
            say("daemon start", results["daemon start"])
            return
        results["daemon start"] = {"wall_s": round(time.perf_counter() - t0, 3), "rss_mb": vm_hwm_mb(proc.pid)}
        say("daemon start", results["daemon start"])
        url = json.loads(info.read_text())["url"]
        with httpx.Client(base_url=url, timeout=timeout) as client:
            for path in ENDPOINTS:
                t1 = time.perf_counter()
                cpu0 = process_cpu_s(proc.pid)
                try:
                    resp = client.get(path)
                    r = {"wall_s": round(time.perf_counter() - t1, 3), "status": resp.status_code,
                         "bytes": len(resp.content)}
                except httpx.TimeoutException:
                    r = {"wall_s": round(time.perf_counter() - t1, 3), "timed_out": True, "timeout_s": timeout}
                except httpx.HTTPError as exc:
                    r = {"wall_s": round(time.perf_counter() - t1, 3), "error": f"{type(exc).__name__}: {exc}"}
                cpu1 = process_cpu_s(proc.pid)
                if cpu0 is not None and cpu1 is not None:
                    r["cpu_s"] = round(cpu1 - cpu0, 3)   # the daemon's CPU while it answered
                r["daemon_rss_mb"] = vm_hwm_mb(proc.pid)
                results[f"api {path}"] = r
                say(f"GET {path}", r)
        results["daemon rss"] = {"rss_mb": vm_hwm_mb(proc.pid)}
        t2 = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=DRAIN_S + 30)
            results["sigterm"] = {"wall_s": round(time.perf_counter() - t2, 3), "rc": rc}
        except subprocess.TimeoutExpired:
            results["sigterm"] = {"wall_s": round(time.perf_counter() - t2, 3), "timed_out": True,
                                  "timeout_s": DRAIN_S + 30}
        say("SIGTERM to exit", results["sigterm"])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        tail = (state / "bench-daemon.log").read_text(errors="replace")
        errors = [line for line in tail.splitlines() if "Error" in line or "failed" in line]
        if errors:
            results["daemon errors"] = errors[-5:]


def say(what: str, r: dict[str, Any]) -> None:
    print(f"  {what:28s} {fmt_time(r)}  {fmt_rss(r)}", flush=True)


def fmt_time(r: dict[str, Any] | None, key: str = "wall_s") -> str:
    if not r:
        return "-"
    if r.get("timed_out"):
        return f"> {r['timeout_s']:g} s"
    value = r.get("seconds") if r.get("seconds") is not None else r.get(key)
    if value is None:
        return "failed" if r.get("rc") else "-"
    text = f"{value:.3f} s" if value < 10 else f"{value:.1f} s"
    if r.get("cpu_s") is not None:
        text += f" / {r['cpu_s']:.3f} CPU-s"
    notes = [f"exit {r['rc']}" if r.get("rc") not in (None, 0) else "",
             f"HTTP {r['status']}" if (r.get("status") or 200) >= 400 else "", r.get("error") or ""]
    if any(notes):
        text += f" ({', '.join(n for n in notes if n)})"
    return text


def fmt_rss(r: dict[str, Any] | None) -> str:
    if not r:
        return ""
    mb = r.get("rss_mb", r.get("daemon_rss_mb"))
    return f"{mb:.0f} MB" if mb is not None else ""


# -- the table ---------------------------------------------------------------------------------------
def table(all_results: dict[int, dict[str, Any]]) -> str:
    sizes = sorted(all_results)
    keys: list[str] = []
    for size in sizes:
        for k in all_results[size]:
            if k not in keys and k not in ("build", "daemon errors", "sizes"):
                keys.append(k)
    head = ("| measurement | target (at 10^5) | " + " | ".join(f"{s:,}" for s in sizes)
            + " | growth per decade (CPU) |")
    lines = [head, "|" + "---|" * (3 + len(sizes))]
    build = "| build (s, DB MB) | - | " + " | ".join(
        f"{all_results[s]['build'].get('template_s', 0) + all_results[s]['build'].get('bulk_s', 0):.1f} s, "
        f"{all_results[s]['build'].get('db_bytes', 0) / 1e6:.0f} MB" for s in sizes) + " | - |"
    lines.append(build)
    for k in keys:
        cells = []
        for s in sizes:
            r = all_results[s].get(k)
            if k == "daemon rss":
                cells.append(fmt_rss(r) or "-")
                continue
            cell = fmt_time(r)
            extra = []
            if r and k.startswith(("job", "new")) and r.get("rss_mb"):
                extra.append(fmt_rss(r))
            if r and k == "job evaluate" and r.get("first_tick_s") is not None:
                extra.append(f"first tick {r['first_tick_s']:.3f} s")
            if r and k == "new evaluate" and r.get("dispatch_after_s") is not None:
                extra.append(f"dispatch {r['dispatch_after_s']:.3f} s")
            if r and (r.get("bytes") or (r.get("stdout_bytes") and not k.startswith(("job", "new", "cli")))):
                extra.append(f"{(r.get('bytes') or r.get('stdout_bytes')) / 1e6:.2f} MB out")
            if r and k.startswith(("list", "report")) and r.get("rss_mb"):
                extra.append(fmt_rss(r))
            cells.append(cell + (f" ({', '.join(extra)})" if extra else ""))
        lines.append(f"| {k} | {target_of(k)} | " + " | ".join(cells) + f" | {growth(all_results, k)} |")
    return "\n".join(lines)


def growth(all_results: dict[int, dict[str, Any]], key: str) -> str:
    """How a measurement's CPU seconds (else its seconds) grow per tenfold checkpoints, from
    the smallest and largest size measured: (b / a) ** (1 / decades)."""
    import math

    sizes = sorted(s for s in all_results if all_results[s].get(key))
    if len(sizes) < 2:
        return "-"

    def value(r: dict[str, Any]) -> float | None:
        for name in ("cpu_s", "seconds", "wall_s"):
            if r.get(name) is not None and not r.get("timed_out"):
                return float(r[name])
        return None

    a, b = value(all_results[sizes[0]][key]), value(all_results[sizes[-1]][key])
    if not a or b is None:
        return "-"
    return f"×{(b / a) ** (1 / math.log10(sizes[-1] / sizes[0])):.2f}"


def target_of(key: str) -> str:
    if key == "job evaluate":
        return "< 0.05 s"
    if key == "new evaluate":
        return "< 2 s"
    if key.startswith("api /checkpoints"):
        return "< 0.5 s"
    if key.startswith(("list ", "api /runs", "api /alerts", "api /silences")):
        return "< 1 s"
    if key.startswith("report") or key == "api /report?policy=bench":
        return "< 5 s"
    if key == "daemon rss":
        return "< 500 MB"
    if key == "sigterm":
        return f"< {DRAIN_S:g} s (drain)"
    return ""


# -- main ---------------------------------------------------------------------------------------------
def check_equal(folder: Path, n_lineages: int, per_lineage: int) -> dict[str, str]:
    """Build `n_lineages` through the API and by the bulk loader; the tables that differ."""
    from monitor.store import Store

    t_end = datetime.now(timezone.utc).replace(microsecond=0)
    template = ss.build_template(folder, n_lineages=n_lineages, t_end=t_end, per_lineage=per_lineage)
    policy = ss.load_bench_policy(folder / "policies")
    with Store.open(folder / "api.duckdb") as api, Store.open(folder / "bulk.duckdb") as bulk:
        ss.build_api_state(api, policy, range(n_lineages), n_lineages=n_lineages, t_end=t_end,
                           per_lineage=per_lineage)
        ss.bulk_state(bulk, template, n_lineages=n_lineages, t_end=t_end, per_lineage=per_lineage)
        return ss.compare_states(api, bulk)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_job":
        p = argparse.ArgumentParser()
        p.add_argument("job")
        p.add_argument("--state", required=True)
        p.add_argument("--policies", required=True)
        p.add_argument("--add", type=int, default=0)
        p.add_argument("--then-dispatch", action="store_true")
        child_job(p.parse_args(argv[1:]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000,10000,100000", help="checkpoints per state, comma-separated")
    p.add_argument("--out", type=Path, default=HERE / "out" / "scale", help="folder for states and results")
    p.add_argument("--step-timeout", type=float, default=150.0, help="seconds each measurement may take")
    p.add_argument("--per-lineage", type=int, default=ss.PER_LINEAGE, help="checkpoints per lineage")
    p.add_argument("--check-equal", type=int, default=0, metavar="N",
                   help="first compare N API-built lineages with their bulk-loaded copy (0: skip)")
    p.add_argument("--keep", action="store_true", help="keep each state folder after measuring it")
    p.add_argument("--reuse", action="store_true",
                   help="measure a state folder kept (--keep) by an earlier run instead of building it again "
                        "(the daemon's and the report's week is then relative to that build)")
    p.add_argument("--skip", default="", help="comma-separated: jobs,new,cli,daemon")
    p.add_argument("--table", type=Path, nargs="+", metavar="JSON",
                   help="only print the table of earlier runs' scale-*.json files (sizes merged)")
    args = p.parse_args(argv)
    if args.table:
        merged: dict[int, dict[str, Any]] = {}
        for path in args.table:
            merged.update({int(k): v for k, v in json.loads(path.read_text())["sizes"].items()})
        print(table(merged))
        return 0
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        p.error(f"--sizes {args.sizes!r}: give checkpoint counts separated by commas, e.g. 1000,10000")
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    report: dict[str, Any] = {"started": stamp, "step_timeout_s": args.step_timeout, "sizes": {}}
    if args.check_equal:
        folder = out / "equality"
        shutil.rmtree(folder, ignore_errors=True)
        diff = check_equal(folder, args.check_equal, args.per_lineage)
        report["equality"] = {"lineages": args.check_equal, "per_lineage": args.per_lineage,
                              "equal": not diff, "differences": diff}
        print(f"bulk loader vs API, {args.check_equal} lineages: {'equal' if not diff else diff}", flush=True)
        if diff:
            return 1
    all_results: dict[int, dict[str, Any]] = {}
    for size in sizes:
        folder = out / f"state-{size}"
        if args.reuse and (folder / "build.json").exists():
            build = json.loads((folder / "build.json").read_text())
            print(f"== {size:,} checkpoints: reusing {folder} (built {build['t_end']})", flush=True)
        else:
            shutil.rmtree(folder, ignore_errors=True)
            print(f"== {size:,} checkpoints: building in {folder}", flush=True)
            build = ss.build_bulk(folder, n_checkpoints=size, per_lineage=args.per_lineage)
            (folder / "build.json").write_text(json.dumps(build, indent=1))
        print(f"  built: {build['n_lineages']} lineages, template {build['template_s']} s, bulk {build['bulk_s']} s, "
              f"{build['db_bytes'] / 1e6:.0f} MB; rows {json.dumps(build['rows'])}", flush=True)
        results: dict[str, Any] = {"build": build}
        state, policies = Path(build["state"]), Path(build["policies"])
        tmp = folder / "tmp"
        tmp.mkdir(exist_ok=True)
        if "jobs" not in skip:
            measure_jobs(state, policies, args.step_timeout, results, tmp)
        if "new" not in skip:
            measure_new(state, policies, args.step_timeout, results, tmp)
        if "cli" not in skip:
            measure_cli(state, policies, args.step_timeout, results, tmp)
        if "daemon" not in skip:
            measure_daemon(state, policies, args.step_timeout, results)
        all_results[size] = results
        report["sizes"][str(size)] = results
        (out / f"scale-{stamp}.json").write_text(json.dumps(report, indent=1, default=str))
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    text = table(all_results)
    print()
    print(text)
    (out / f"scale-{stamp}.md").write_text(text + "\n")
    (out / f"scale-{stamp}.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"\nwrote {out / f'scale-{stamp}.json'} and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
