"""Where a step of N tokens goes, op by op: each native kernel of one decoder layer of
the default model (SmolLM2-135M shapes, bf16w), timed alone at N tokens over a
256-token context, and scaled to the model's 30 layers.

    python3 scripts/dev/bench_step_ops.py [--tokens 1,2,4,6,7,8,12,16] [--threads 2] [--context 256]

Reads as: which op grows with the tokens of a verification step. The numbers are the
kernels alone (warm caches for the weights of a layer only when a layer's weights fit
in cache: each op cycles through 30 copies of its weight so that, as in a real step,
they stream from memory)."""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dspark.runtime import cpu_kernels as ck
from dspark.runtime import cpu_matmul as mm

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS = 576, 9, 3, 64, 1536, 30


def timed(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1,2,4,6,7,8,12,16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if not ck.available():
        raise SystemExit(f"native kernels unavailable: {ck.why_unavailable()}")
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    qkv_w = HEADS * HEAD_DIM + 2 * KV_HEADS * HEAD_DIM
    shapes = {"qkv": (qkv_w, HIDDEN), "o": (HIDDEN, HEADS * HEAD_DIM), "gate_up": (2 * INTER, HIDDEN),
              "down": (HIDDEN, INTER)}
    weights = {name: [mm.PackedBf16((torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16))
                      for _ in range(LAYERS)] for name, (n, k) in shapes.items()}
    L = args.context + 32
    kc = torch.randn(1, KV_HEADS, L, HEAD_DIM, generator=g)
    vc = torch.randn(1, KV_HEADS, L, HEAD_DIM, generator=g)
    print(f"ISA {mm.gemm_isa()}, {args.threads} threads, context {args.context}; ms per step, 30 layers")
    cols = list(shapes) + ["attention", "sum"]
    print(f"{'N':>3} " + " ".join(f"{c:>9}" for c in cols))
    for n_tok in [int(t) for t in args.tokens.split(",")]:
        res = {c: [] for c in cols}
        for _ in range(args.rounds):
            for name, (n, k) in shapes.items():
                x = torch.randn(n_tok, k, generator=g)
                it = iter(range(10 ** 9))
                ws = weights[name]
                res[name].append(timed(lambda: mm.gemm_bf16w(x, ws[next(it) % LAYERS]), 60) * LAYERS)
            qkv = torch.randn(n_tok, qkv_w, generator=g)
            slots = torch.zeros(n_tok, dtype=torch.int64)
            pos = torch.arange(args.context, args.context + n_tok)
            res["attention"].append(timed(lambda: ck.attention_f32(qkv, HEADS, kc, vc, slots, pos), 60) * LAYERS)
        med = {c: statistics.median(res[c]) for c in cols if c != "sum"}
        med["sum"] = sum(med.values())
        print(f"{n_tok:>3} " + " ".join(f"{med[c]:>9.2f}" for c in cols))


if __name__ == "__main__":
    main()
