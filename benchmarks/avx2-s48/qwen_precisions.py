"""The second target stepped at 1-8 tokens in fp32 (native f32w kernel) and in bf16w,
both loaded side by side and timed alternately (median of 9), one request, 64 tokens of
context; and what `auto`'s own measurement (one [9728 x 896] weight, 1 + 8 rows) reads.

    python3 benchmarks/avx2-s48/qwen_precisions.py
"""
import statistics
import time
from pathlib import Path

import torch

from dspark.runtime import loader
from dspark.runtime.batch import FlatBatch
from dspark.runtime.kv_cache import KVCachePool

path = next((Path.home() / ".cache/dspark/models").glob("qwen2.5-coder-0.5b-instruct-*"))
arms = {p: loader.load_transformer(path, p) for p in ("fp32", "bf16w")}
ctx = list(range(1000, 1064))
caches = {}
for name, m in arms.items():
    c = KVCachePool(m.cfg, 1, 256, m.dtype)
    s = c.allocate(0)
    m(FlatBatch.from_requests([ctx], [0], [s]), c)
    caches[name] = (c, s)
ns = (1, 2, 4, 8)
times = {(a, n): [] for a in arms for n in ns}
with torch.inference_mode():
    for rep in range(9):
        for n in ns:
            for name in (list(arms) if rep % 2 else list(arms)[::-1]):
                m, (c, s) = arms[name], caches[name]
                c.truncate(s, len(ctx))
                t = time.perf_counter()
                m(FlatBatch.from_requests([list(range(2000, 2000 + n))], [len(ctx)], [s], logits="all"), c)
                times[(name, n)].append((time.perf_counter() - t) * 1e3)
print("ms per step (median of 9, alternating), one request, 64 tokens of context")
print("| tokens | " + " | ".join(map(str, ns)) + " |")
for name in arms:
    print(f"| {name} | " + " | ".join(f"{statistics.median(times[(name, n)]):.1f}" for n in ns) + " |")
print(loader.choose_precision(arms["fp32"].cfg)[1])
