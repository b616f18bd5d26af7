"""Poll cost: our incremental poll against a naive full listing, on a large fake Hub.

The fake Hub holds N repos under one author; a first poll sets the rule's watermark, then
K repos change. The incremental poll (`monitor.hub.poll.poll_rule`) lists newest-modified first
and stops at the watermark; the naive poll lists every repo of the author and diffs the
(repo, sha) pairs against what the database already holds. Requests are counted at the
fake Hub; wall time includes the fake server's own work (it runs in this process).

    python benchmarks/poll_cost.py [--repos 50000] [--new 20] [--page-size 1000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["DISABLE_SAFETENSORS_CONVERSION"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repos", type=int, default=50_000, help="repos on the fake Hub")
    parser.add_argument("--new", type=int, default=20, help="repos changed since the watermark")
    parser.add_argument("--page-size", type=int, default=1000, help="listing page size of the fake Hub")
    args = parser.parse_args(argv)

    from huggingface_hub import HfApi

    from monitor.demo.fakehub import FakeHub
    from monitor.demo.hub_repos import add_filler_repos
    from monitor.hub.client import LIST_EXPAND, HubClient
    from monitor.hub.poll import poll_rule
    from monitor.hub.rules import WatchRule
    from monitor.store import Store

    author = "filler-org"
    with tempfile.TemporaryDirectory(prefix="poll-cost-") as tmp, FakeHub(page_size=args.page_size) as hub:
        t = time.perf_counter()
        ids = add_filler_repos(hub, args.repos, author=author)
        print(f"fake Hub: {len(ids):,} repos registered in {time.perf_counter() - t:.1f} s")
        store = Store.open(Path(tmp) / "state.duckdb")
        client = HubClient(hub.url, token=False, store=store)
        rule = WatchRule(name="bench", author=author)
        first = poll_rule(store, client, rule)                    # sets the watermark
        assert first.error is None, first.error
        api = HfApi(endpoint=hub.url, token=False)
        known = {(m.id, m.sha) for m in api.list_models(author=author, sort="lastModified",
                                                         expand=LIST_EXPAND)}   # the naive state

        newest = hub.repo(ids[-1]).last_modified
        for i in range(args.new):                                 # K repos change after the poll
            hub.add_commit(ids[i * 7 % len(ids)], {"update.txt": f"{i}".encode()},
                           date=newest + timedelta(minutes=i + 1))

        hub.reset_log()
        t = time.perf_counter()
        result = poll_rule(store, client, rule)
        ours_s = time.perf_counter() - t
        ours_requests = hub.count_requests()
        assert result.error is None and result.new == args.new, result

        hub.reset_log()
        t = time.perf_counter()
        listing = list(api.list_models(author=author, sort="lastModified", expand=LIST_EXPAND))
        fresh = {(m.id, m.sha) for m in listing} - known
        naive_s = time.perf_counter() - t
        naive_requests = hub.count_requests()
        store.close()

    print(f"\npoll cost: {len(listing):,} repos, {args.new} changed since the watermark, "
          f"page size {args.page_size}")
    print(f"{'':<22}{'requests':>10}{'new found':>11}{'wall s':>9}")
    print(f"{'incremental (ours)':<22}{ours_requests:>10,}{result.new:>11,}{ours_s:>9.2f}")
    print(f"{'naive full listing':<22}{naive_requests:>10,}{len(fresh):>11,}{naive_s:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
