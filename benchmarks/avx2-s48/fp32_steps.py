"""The second target (Qwen2.5-Coder-0.5B, fp32) stepped at 1-8 tokens: its linears on
torch's `F.linear` (the fp32 precision until now) against the native fp32-weight kernel
(gemm_f32w, and the decoder stack it allows), the two models loaded side by side and
timed alternately, step by step. Also: whether verifying 4 tokens in one step gives the
bits of feeding them one per step, on each arm.

    python3 benchmarks/avx2-s48/fp32_steps.py [model dir]
"""
import statistics
import sys
import time
from pathlib import Path

import torch

from dspark.runtime import loader
from dspark.runtime.batch import FlatBatch
from dspark.runtime.kv_cache import KVCachePool

path = Path(sys.argv[1] if len(sys.argv) > 1 else
            next((Path.home() / ".cache/dspark/models").glob("qwen2.5-coder-0.5b-instruct-*")))
native = loader.load_transformer(path, "fp32")
real = loader.use_f32_panels
loader.use_f32_panels = lambda model, panels=None: 0  # the torch arm: linears left on F.linear
plain = loader.load_transformer(path, "fp32")
loader.use_f32_panels = real
arms = {"torch F.linear": plain, "native f32w": native}
ctx = list(range(1000, 1064))
caches = {}
for name, m in arms.items():
    c = KVCachePool(m.cfg, 1, 256, m.dtype)
    s = c.allocate(0)
    m(FlatBatch.from_requests([ctx], [0], [s]), c)
    caches[name] = (c, s)

times = {(name, n): [] for name in arms for n in (1, 2, 3, 4, 8)}
with torch.inference_mode():
    for rep in range(9):
        for n in (1, 2, 3, 4, 8):
            for name in (list(arms) if rep % 2 else list(arms)[::-1]):
                m, (c, s) = arms[name], caches[name]
                c.truncate(s, len(ctx))
                t = time.perf_counter()
                m(FlatBatch.from_requests([list(range(2000, 2000 + n))], [len(ctx)], [s], logits="all"), c)
                times[(name, n)].append((time.perf_counter() - t) * 1e3)
print("ms per step (median of 9, alternating), one request, 64 tokens of context")
print("| tokens | " + " | ".join(map(str, (1, 2, 3, 4, 8))) + " |")
for name in arms:
    print(f"| {name} | " + " | ".join(f"{statistics.median(times[(name, n)][1:]):.1f}" for n in (1, 2, 3, 4, 8)) + " |")

toks = [2001, 2002, 2003, 2004]
for name, m in arms.items():
    c, s = caches[name]
    c.truncate(s, len(ctx))
    together = m(FlatBatch.from_requests([toks], [len(ctx)], [s], logits="all"), c)[0]
    c.truncate(s, len(ctx))
    alone = torch.cat([m(FlatBatch.from_requests([[t]], [len(ctx) + i], [s], logits="all"), c)[0]
                       for i, t in enumerate(toks)])
    diff = (together != alone).sum().item()
    print(f"{name}: 4 tokens verified together vs one by one: {diff} of {alone.numel()} logits differ, "
          f"max |diff| {(together - alone).abs().max().item():.2e}")
