"""Run the full emergence lab and print its leave-one-family-out table.

    python benchmarks/lab_full.py [--out state/lab-full] [--workers 2] [--byte-budget N] [--seeds 0,1,2]
                                  [--families gpt2,llama-3,...]

Trains the full lab (`monitor.lab.config.LabConfig`: gpt2, llama-3, bert-base-uncased,
smollm2 and the toy unigram tokenizer, seeds 0-2, the same byte stream for every family),
scores and labels every checkpoint (`lab.json`), then writes the lab report with
`monitor.lab.report.write_lab_report` and prints the LOFO errors of every x-axis with the
bootstrap intervals of their difference to L*. A killed run resumes where it stopped.
One seed of the five families took 2,421 s (40 minutes) on 2 shared cores; the defaults (five
families, three seeds) take hours. The time is printed at the end.
This is a measurement, not a test: whatever the table says is the result.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from monitor.lab.config import LabConfig
    from monitor.lab.pipeline import lab_summary, run_lab
    from monitor.lab.report import write_lab_report

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("state") / "lab-full")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--byte-budget", type=int, default=None)
    parser.add_argument("--seeds", default=None, help="Comma-separated seeds (default: the config's, 0,1,2).")
    parser.add_argument("--families", default=None,
                        help="Comma-separated tokenizer folders (default: the config's five families).")
    parser.add_argument("--shared", type=Path, default=Path("../shared"))
    args = parser.parse_args(argv)
    shared = args.shared
    config = LabConfig(tokenizers_dir=shared / "tokenizers", text_corpus=shared / "corpus" / "calib-v0-alt",
                       calib_corpus=shared / "corpus" / "calib-v0", cloze_task=shared / "tasks" / "cloze-v0.jsonl")
    if args.byte_budget:
        config = config.with_(byte_budget=args.byte_budget)
    if args.seeds:
        config = config.with_(seeds=tuple(int(s) for s in args.seeds.split(",")))
    if args.families:
        config = config.with_(families=tuple(f.strip() for f in args.families.split(",") if f.strip()))
    start = time.monotonic()
    record = run_lab(config, args.out, workers=args.workers, progress=sys.stderr.isatty())
    print(f"trained, scored and labelled {len(record.checkpoints)} checkpoints in "
          f"{time.monotonic() - start:.0f} s -> {args.out / 'lab.json'}")
    for row in lab_summary(record):
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    write_lab_report(args.out / "lab.json", args.out / "report")
    # The report's Markdown holds the LOFO table of every axis with the intervals on the
    # difference to L*, and the sentences that say what those intervals support.
    print((args.out / "report" / "lab-report.md").read_text(encoding="utf-8"))
    print(f"report: {args.out / 'report'}; total {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
