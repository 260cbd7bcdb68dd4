"""Held-out learning curves of several training runs on one figure, and their table.

    python3 scripts/train/plot_runs.py --out runs/equal/curves.png \
        dspark=runs/equal/dspark/train_log.jsonl dflash=runs/equal/dflash/train_log.jsonl

Each NAME=PATH is a `train_log.jsonl` written by `dspark train --eval-data ...`. Left:
held-out greedy tau (teacher-forced) against optimizer steps; right: position-1
acceptance against position-1 training examples seen (the unit the runs are matched
on). Prints a Markdown table of every run's evaluations at the steps all runs share,
and the last one of each.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load(path: Path) -> tuple[list[dict], dict[int, int]]:
    """The held-out evaluations, and position-1 examples seen by each logged step. A
    resumed run logs the steps after its checkpoint again: the later record of a step
    (and of an evaluation) replaces the earlier one."""
    evals, per_step = {}, {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        if "heldout_tau" in r:
            evals[int(r["step"])] = r
        elif "position1_examples" in r:
            per_step[int(r["step"])] = int(r["position1_examples"])
    seen, total = {}, 0
    for step in sorted(per_step):
        total += per_step[step]
        seen[step] = total
    return [evals[s] for s in sorted(evals)], seen


def examples_at(seen: dict[int, int], step: int) -> int:
    logged = [s for s in seen if s <= step]
    return seen[max(logged)] if logged else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="NAME=TRAIN_LOG", help="a run's name and its train_log.jsonl")
    ap.add_argument("--out", required=True, help="PNG to write")
    args = ap.parse_args(argv)
    runs = {}
    for spec in args.runs:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            print(f"error: {spec!r} is not NAME=PATH to an existing train_log.jsonl", file=sys.stderr)
            return 2
        runs[name] = load(Path(path))
        if not runs[name][0]:
            print(f"error: {path} has no held-out evaluations (train with --eval-data)", file=sys.stderr)
            return 2

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    for name, (evals, seen) in runs.items():
        steps = [r["step"] for r in evals]
        a.plot(steps, [r["heldout_tau"] for r in evals], "o-", label=name)
        b.plot([examples_at(seen, s) / 1e3 for s in steps], [r["heldout_accept@1"] for r in evals], "o-", label=name)
    a.set(xlabel="optimizer step", ylabel="greedy tau (teacher-forced, block 7)", title="held-out tau")
    b.set(xlabel="position-1 training examples (thousands)", ylabel="acceptance at position 1",
          title="held-out first-token acceptance")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}", file=sys.stderr)

    shared = sorted(set.intersection(*({r["step"] for r in ev} for ev, _ in runs.values())))
    print("| run | step | position-1 examples | held-out tau | accept @1 | @2 | @3 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (evals, seen) in runs.items():
        rows = [r for r in evals if r["step"] in shared[-3:]] + ([evals[-1]] if evals[-1]["step"] not in shared else [])
        for r in rows:
            print(f"| {name} | {r['step']:,} | {examples_at(seen, r['step']):,} | {r['heldout_tau']:.3f} | "
                  f"{r['heldout_accept@1']:.3f} | {r['heldout_accept@2']:.3f} | {r['heldout_accept@3']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
