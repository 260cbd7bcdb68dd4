"""`dspark bench record`: a served sweep as a results record (dspark.bench.record)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(bsub: argparse._SubParsersAction) -> None:
    from dspark.bench.performance_doc import QUESTIONS

    p = bsub.add_parser(
        "record", help="append a sweep's numbers to benchmarks/results/ and rewrite docs/performance.md",
        description="Make one results record from a sweep.json (`dspark bench sweep --out DIR`): its date, commit "
                    "and CPU as the sweep kept them when it ran, its command line, a summary of the measured "
                    "numbers (output tok/s medians over rounds, ratios against the reference paired by round "
                    "with their range) followed by your --note, and the numbers themselves. Appended to "
                    "benchmarks/results/QUESTION.jsonl in date order; docs/performance.md is rewritten from "
                    "all records. Refused: a sweep whose prompts repeated, that ran uncommitted code, or with a "
                    "failed configuration (--allow-repeats, --allow-dirty record them anyway, and say so).")
    p.add_argument("sweep", metavar="SWEEP", help="a sweep's output directory or its sweep.json")
    p.add_argument("--question", required=True, choices=list(QUESTIONS),
                   help="the results file: " + "; ".join(f"{k}: {v}" for k, v in QUESTIONS.items()))
    p.add_argument("--note", default="", metavar="TEXT",
                   help="what the numbers mean (the files, the precision, what changed), appended to the summary")
    p.add_argument("--command", dest="run_command", default=None, metavar="TEXT",
                   help="the command to name instead of the sweep's own (e.g. the benchmarks/configs script "
                        "with its variables)")
    p.add_argument("--allow-repeats", action="store_true", help="record a sweep whose prompts repeated")
    p.add_argument("--allow-dirty", action="store_true", help="record a sweep of uncommitted code")
    p.add_argument("--dry-run", action="store_true", help="print the record, write nothing")
    p.set_defaults(func=run_record)


def run_record(args: argparse.Namespace) -> int:
    from dspark.bench.record import append_record, record_from_sweep
    from dspark.errors import UserError

    path = Path(args.sweep)
    if path.is_dir():
        path = path / "sweep.json"
    try:
        result = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read sweep results {path}: {e}") from None
    record = record_from_sweep(result, note=args.note, command=args.run_command, allow_repeats=args.allow_repeats,
                               allow_dirty=args.allow_dirty)
    print(json.dumps(record, indent=1, ensure_ascii=False))
    if args.dry_run:
        return 0
    written = append_record(record, args.question)
    print(f"appended to {written}; docs/performance.md rewritten", file=sys.stderr)
    return 0
