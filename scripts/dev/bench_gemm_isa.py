"""A matmul's AVX-512 variant against its AVX2 one, interleaved, on the default model's
shapes (and the second target's MLP): microseconds per call for 1..16 rows. `--kernel
bf16w` (the default) or `q8x:TYPE` (the q8x precision over random blocks of a GGUF type,
e.g. q8x:Q8_0, q8x:Q4_K; its AVX-512 variant is the AVX512-VNNI form).

    python3 scripts/dev/bench_gemm_isa.py [--kernel q8x:Q4_K] [--threads 2] [--rounds 5] [--json OUT]

Both variants give the same bits (tests/test_cpu_kernels.py, tests/test_q8x_kernel.py);
this measures speed only. On a CPU without AVX-512 both rows are the AVX2 variant."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import sys
from pathlib import Path

import torch

from dspark.runtime import cpu_kernels as ck
from dspark.runtime import cpu_matmul as mm

SHAPES = {  # name: (out_features, in_features)
    "smollm qkv": (960, 576), "smollm gate_up": (3072, 576), "smollm down": (576, 1536),
    "qwen gate_up": (9728, 896), "qwen down": (896, 4864),
}


def weights(kernel: str, n: int, k: int, g: torch.Generator):
    """The weights of one shape and the matmul that reads them."""
    if kernel == "bf16w":
        return mm.PackedBf16(torch.randn(n, k, generator=g).to(torch.bfloat16)), mm.gemm_bf16w
    if not kernel.startswith("q8x:"):
        raise SystemExit(f"--kernel must be bf16w or q8x:TYPE, got {kernel!r}")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from test_quant_kernels import random_blocks

    from dspark.runtime.quantized import BLOCKS, QuantMatrix, gemm_quant
    qtype = kernel[4:]
    if qtype not in BLOCKS:
        raise SystemExit(f"{qtype}: not a GGUF type")
    if k % BLOCKS[qtype][0]:
        return None, None  # rows of k are not whole blocks of the type (a file stores them in another)
    return QuantMatrix([(qtype, random_blocks(qtype, n, k, seed=n))], k, int8_activations=True), gemm_quant


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", default="1,2,4,6,7,8,12,16")
    ap.add_argument("--kernel", default="bf16w", help="bf16w, or q8x:TYPE (a GGUF type: Q8_0, Q4_K, Q6_K ...)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not ck.available():
        raise SystemExit(f"native kernels unavailable: {ck.why_unavailable()}")
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    rows = [int(r) for r in args.rows.split(",")]
    out = []
    print(f"{args.kernel}: {mm.set_gemm_isa('avx512')} ({mm.q8x_form()}) / avx2, {args.threads} threads")
    print(f"{'shape':>16} {'rows':>4} {'avx2 us':>9} {'avx512 us':>10} {'ratio':>6}")
    for name, (n, k) in SHAPES.items():
        w, call = weights(args.kernel, n, k, g)
        if w is None:
            continue
        for m in rows:
            x = torch.randn(m, k, generator=g)
            times = {"avx2": [], "avx512": []}
            for _ in range(args.rounds):
                for isa in ("avx2", "avx512"):
                    mm.set_gemm_isa(isa)
                    for _ in range(3):
                        call(x, w)
                    t = time.perf_counter()
                    for _ in range(20):
                        call(x, w)
                    times[isa].append((time.perf_counter() - t) / 20 * 1e6)
            a, b = statistics.median(times["avx2"]), statistics.median(times["avx512"])
            out.append({"kernel": args.kernel, "shape": name, "n": n, "k": k, "rows": m, "avx2_us": a, "avx512_us": b})
            print(f"{name:>16} {m:>4} {a:>9.0f} {b:>10.0f} {a / b:>6.2f}")
    mm.set_gemm_isa("avx512")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
