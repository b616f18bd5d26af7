"""`python -m monitor.notify --policy FILE [--policy FILE ...] [--db DB] [--now ISO]`

One outbox pass — evaluate new scores, flush due groups, send what is due — exactly as
`lstar alerts dispatch`, without loading the rest of the command line (model loading,
curve fitting): for cron jobs and the crash tests, which start it many times.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from monitor.errors import LstarError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m monitor.notify", description=__doc__.splitlines()[2])
    parser.add_argument("--policy", action="append", required=True, type=Path, help="policy file")
    parser.add_argument("--db", type=Path, default=None, help="DuckDB state file")
    parser.add_argument("--now", default=None, help="act as if it were this time (ISO 8601)")
    parser.add_argument("--no-evaluate", action="store_true", help="only flush and send")
    args = parser.parse_args(argv)
    try:
        from monitor.notify.dispatcher import run_pass
        from monitor.notify.silences import parse_time
        from monitor.policy import load_policies
        from monitor.store import DEFAULT_DB_PATH, Store, utcnow

        policies = load_policies(args.policy)
        now = parse_time(args.now) if args.now else utcnow()
        with Store.open(args.db or DEFAULT_DB_PATH) as store:
            out = run_pass(store, policies, now=now, evaluate=not args.no_evaluate)
    except LstarError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
