"""Step times of the default model (or --model) with the native kernels of two (or more) git revisions,
interleaved.

Each revision's `dspark/runtime/kernels/` is compiled with the project's flags into a
cache directory of its own, under the file name the current sources would have, so a
child process that points DSPARK_CACHE there loads that revision's kernels with
today's Python. Children alternate revision by revision, round by round (drift falls on
all alike); each times one target forward of N tokens on a 256-token context (median of
15 after warm-up) for N = 1, 2, 4, 8, 16 (or --tokens). Reported: per revision the median step times
over the rounds and the median of each round's ratio to the first revision.

    python3 scripts/dev/bench_kernel_revisions.py --revs 9c47bbe,HEAD --rounds 6
    python3 scripts/dev/bench_kernel_revisions.py --revs 9c47bbe,HEAD --dtype bf16w
    python3 scripts/dev/bench_kernel_revisions.py --revs 2fef1e0,HEAD --model FILE.gguf --dtype q8x
    DSPARK_GEMM_ISA=avx2 python3 scripts/dev/bench_kernel_revisions.py --revs 9c47bbe,HEAD --dtype bf16w
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

CHILD = r"""
import json, statistics, sys, time
import torch
from dspark.runtime.batch import FlatBatch
from dspark.runtime.target import Target
torch.set_num_threads(int(sys.argv[2]))
t = Target.load(sys.argv[4], dtype=sys.argv[1], device="cpu", max_len=1024)
cache = t.new_cache(1, 1024)
s = cache.allocate(0)
t.model(FlatBatch.from_requests([list(range(1000, 1256))], [0], [s], logits="last", device="cpu"), cache, [])
def step(n):
    cache.truncate(s, 256)
    b = FlatBatch.from_requests([list(range(2000, 2000 + n))], [256], [s], logits="all", device="cpu")
    t0 = time.perf_counter()
    t.model(b, cache, [])
    return time.perf_counter() - t0
out = {}
for n in json.loads(sys.argv[3]):
    for _ in range(3):
        step(n)
    out[n] = statistics.median(step(n) for _ in range(15)) * 1e3
print("RESULT " + json.dumps({"precision": t.model.precision, "ms": out}))
"""


def build(rev: str, where: Path) -> Path:
    """The kernels of `rev` compiled into where/<rev>/kernels/, named for today's sources."""
    from dspark.runtime import cpu_kernels as ck

    src = where / rev / "src"
    src.mkdir(parents=True, exist_ok=True)
    names = subprocess.run(["git", "ls-tree", "--name-only", rev, "dspark/runtime/kernels/"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        data = subprocess.run(["git", "show", f"{rev}:{name}"], cwd=ROOT, capture_output=True, check=True).stdout
        (src / Path(name).name).write_bytes(data)
    cache = where / rev
    (cache / "kernels").mkdir(exist_ok=True)
    sources = [src / p.name for p in ck._SOURCES if (src / p.name).exists()]
    lib = cache / "kernels" / f"dspark_kernels-{ck.build_id()}.so"
    r = subprocess.run(["cc", *ck._FLAGS, "-o", str(lib), *map(str, sources)], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"error: the kernels of {rev} do not compile: {r.stderr[-500:]}")
    return cache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--revs", required=True, help="comma-separated git revisions; the first is the baseline")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--dtype", default="auto", help="the target's precision (default: auto)")
    ap.add_argument("--model", default="default", help="the target: default, or a model path / GGUF file")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", default="1,2,4,8,16", help="step sizes to time (must include 1 and 8)")
    ap.add_argument("--out", help="also write the rounds' raw times here (JSON)")
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    if 1 not in tokens or 8 not in tokens:
        sys.exit("error: --tokens must include 1 and 8 (the report's T(8)/T(1))")
    revs = args.revs.split(",")
    where = Path(tempfile.mkdtemp(prefix="dspark-kernel-revs-"))
    caches = {rev: build(rev, where) for rev in revs}
    runs: dict[str, list[dict[int, float]]] = {rev: [] for rev in revs}
    precision = None
    for r in range(args.rounds):
        for rev in (revs if r % 2 == 0 else revs[::-1]):
            child = [sys.executable, "-c", CHILD, args.dtype, str(args.threads), json.dumps(tokens), args.model]
            p = subprocess.run(child, cwd=ROOT,
                               capture_output=True, text=True, env={**os.environ, "DSPARK_CACHE": str(caches[rev])})
            line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                sys.exit(f"error: the {rev} run failed: {p.stderr[-1000:]}")
            got = json.loads(line[7:])
            precision = got["precision"]
            runs[rev].append({int(k): v for k, v in got["ms"].items()})
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"precision {precision}, {args.threads} threads, {args.rounds} rounds, context 256; "
          f"DSPARK_GEMM_ISA={os.environ.get('DSPARK_GEMM_ISA', '(widest)')}")
    base = revs[0]
    for rev in revs:
        med = {n: statistics.median(x[n] for x in runs[rev]) for n in runs[rev][0]}
        ratios = {n: [a[n] / b[n] for a, b in zip(runs[rev], runs[base])] for n in med}
        cells = "  ".join(f"T({n}) {med[n]:.2f} ms ({statistics.median(ratios[n]):.2f}x, "
                          f"{min(ratios[n]):.2f}-{max(ratios[n]):.2f})" for n in med)
        print(f"{rev:10s} {cells}  T(8)/T(1) {med[8] / med[1]:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"revs": revs, "precision": precision, "rounds": runs}, indent=1))


if __name__ == "__main__":
    main()
