#!/usr/bin/env python3
"""Training throughput: the previous trainer against the current one, every method,
side by side on the same machine, data and thread count.

For each method and trainer, `dspark train` runs STEPS optimizer steps on the first
NUM_SEQS training sequences (the feature cache is built by an untimed warm-up run
first), one log record per step. Reported per configuration (median over the timed
steps, the first step excluded):
  * position-1 examples per second: supervised first drafted positions (anchors),
  * supervised tokens per second: every supervised drafted position,
  * seconds per step.
The previous trainer is the commit OLD_REF, checked out in a git worktree, with the
recipe the shipped drafters were trained with (4 sequences x 8 sampled anchors,
block 16, full vocabulary, fp32); the current one uses the recipe of
dspark/drafters/shipped/README.md (dense anchors, top-k teacher, reduced draft
vocabulary, block of 7 drafted tokens, bf16 autocast where the CPU has it).

    python scripts/dev/bench_training.py --data runs/data/train.jsonl --out runs/training.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
OLD_REF = "1856a76"

OLD = {
    "common": ["--batch-size", "4", "--blocks-per-seq", "8"],
    "dspark": ["--block-size", "16", "--markov-rank", "64"],
    "dflash": ["--block-size", "16"],
    "eagle3": ["--block-size", "16"],
    "mtp": [],
}
NEW = {
    "common": ["--draft-vocab-size", "8192", "--batch-size", "4"],
    "dspark": ["--block-size", "7", "--sample-from-anchor", "--markov-rank", "64", "--blocks-per-seq", "64"],
    "dflash": ["--block-size", "8", "--blocks-per-seq", "64"],
    "eagle3": ["--blocks-per-seq", "256"],
    "mtp": ["--blocks-per-seq", "256"],
}


def run(cmd: list[str], env: dict) -> None:
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{res.stderr[-3000:]}")


def cpu_flags() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        return "unknown"
    model = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in out.splitlines() if line.startswith("Flags")), [])
    keep = sorted(f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "fma"))
    return f"{model}; {' '.join(keep)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--num-seqs", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--methods", default="dspark,dflash,eagle3,mtp")
    ap.add_argument("--old-ref", default=OLD_REF)
    ap.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-training-"))
    work.mkdir(parents=True, exist_ok=True)
    lines = Path(args.data).read_text().splitlines()[: args.num_seqs]
    data = work / "data.jsonl"
    data.write_text("\n".join(lines) + "\n")
    old_tree = work / "old-tree"
    if not old_tree.exists():
        run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old_tree), args.old_ref], dict(os.environ))
    results = []
    for method in args.methods.split(","):
        for name, tree, recipe in (("previous", old_tree, OLD), ("current", ROOT, NEW)):
            env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS=str(args.threads))
            base = [sys.executable, "-m", "dspark.cli.main", "train", "--method", method, "--data", str(data),
                    "--feature-cache", str(work / f"cache-{name}"), "--threads", str(args.threads),
                    "--no-progress", "--log-every", "1", "--save-every", "100000"]
            base += recipe["common"] + recipe[method]
            run(base + ["--out", str(work / f"warm-{name}-{method}"), "--max-steps", "1"], env)
            out = work / f"{name}-{method}"
            run(base + ["--out", str(out), "--max-steps", str(args.steps)], env)
            log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines() if x.strip()]
            log = [r for r in log if "loss" in r]
            dt = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(log, log[1:])]
            pos = [r["positions"] for r in log[1:]]
            # the previous trainer does not log first positions: every sampled anchor has one
            first = [r.get("position1_examples", 4 * 8) for r in log[1:]]
            step_s = statistics.median(dt)
            rec = dict(method=method, trainer=name, step_s=round(step_s, 3),
                       position1_per_s=round(statistics.median(f / d for f, d in zip(first, dt)), 1),
                       tokens_per_s=round(statistics.median(p / d for p, d in zip(pos, dt)), 1),
                       args=recipe["common"] + recipe[method])
            results.append(rec)
            print(json.dumps(rec), flush=True)
    print(f"\nCPU: {cpu_flags()}; {args.threads} thread(s); {args.num_seqs} sequences; {args.steps} steps\n")
    print("| method | trainer | s/step | position-1 examples/s | supervised tokens/s | ratio (pos-1/s) |")
    print("|---|---|---|---|---|---|")
    for rec in results:
        prev = next(r for r in results if r["method"] == rec["method"] and r["trainer"] == "previous")
        ratio = rec["position1_per_s"] / prev["position1_per_s"]
        print(f"| {rec['method']} | {rec['trainer']} | {rec['step_s']:.2f} | {rec['position1_per_s']:.1f} | "
              f"{rec['tokens_per_s']:.1f} | {ratio:.1f}x |")
    if args.out:
        Path(args.out).write_text(json.dumps({"cpu": cpu_flags(), "threads": args.threads, "num_seqs": args.num_seqs,
                                              "steps": args.steps, "old_ref": args.old_ref, "results": results},
                                             indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
