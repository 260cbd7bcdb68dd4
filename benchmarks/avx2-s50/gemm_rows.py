"""The bf16w matmul's time by rows, for the drafter's weight shapes (warm caches, median
of 200 calls): whether a draft's 7-8 rows are bound by reading the weights or by the
arithmetic.

    python3 benchmarks/avx2-s50/gemm_rows.py
"""
import statistics
import time

import torch

from dspark.runtime.cpu_matmul import PackedBf16, gemm_bf16w

torch.manual_seed(0)
# the shipped drafter's (dspark/drafters/shipped/dspark/config.json): 2 layers, 6 taps
shapes = {"draft LM head": (8192, 576), "q,k,v": (960, 576), "o": (576, 576), "gate,up": (3072, 576),
          "down": (576, 1536), "fc (context)": (576, 3456)}
for name, (n, k) in shapes.items():
    w = PackedBf16((torch.randn(n, k) * 0.02).bfloat16())
    row = []
    for m in (1, 2, 4, 7, 8):
        x = torch.randn(m, k)
        for _ in range(20):
            gemm_bf16w(x, w)
        ts = []
        for _ in range(200):
            t = time.perf_counter()
            gemm_bf16w(x, w)
            ts.append(time.perf_counter() - t)
        ms = statistics.median(ts) * 1e3
        row.append(f"{m} rows {ms:.3f} ms ({2 * m * n * k / ms / 1e6:.0f} GFLOP/s)")
    print(f"{name:14s} [{n} x {k}] {n * k * 2 / 1e6:.1f} MB:  " + ";  ".join(row))
