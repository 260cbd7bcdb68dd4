"""torch's fp32 `F.linear` (the `fp32` precision's matmul, which the second target's
GGUF runs in) at 1-8 rows, on 48 distinct [4864 x 896] weights (Qwen2.5-0.5B's MLP
shape, 836 MB in all, so they stream from memory as in a forward): ms per call, median
of 5 passes.

    python3 benchmarks/avx2-s47/fp32_linear_rows.py
"""
import statistics, time
import torch
import torch.nn.functional as F

torch.manual_seed(0)
ws = [torch.randn(4864, 896) for _ in range(48)]
for m in (1, 2, 3, 4, 8):
    x = torch.randn(m, 896)
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        for w in ws:
            F.linear(x, w)
        ts.append((time.perf_counter() - t) / len(ws) * 1e3)
    print(f"M={m}: {statistics.median(ts):.3f} ms per fp32 linear")
