"""What a one-request DSpark draft costs against what its weights cost to read.

A default engine (held in speculation, drafter on) is stepped until it drafts for one
request; that draft call is then timed beside the drafter's linears alone (the
backbone's 14 projections and the heads, each called on an 8-row input, in the
weight kind the engine gave them), alternating, at 2 torch threads and at 1.

    python3 benchmarks/amx-s56/draft_floor.py > benchmarks/amx-s56/draft_floor.txt
"""

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from bench_draft_ab import capture  # noqa: E402

from dspark.runtime.weight_formats import weight_kind  # noqa: E402

inner, (reqs, n) = capture(1)
lins = [m for layer in inner.layers for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                                              layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj,
                                              layer.mlp.down_proj)]
heads = [m for m in inner.modules() if isinstance(m, torch.nn.Linear) and m.out_features >= 4096]
for name, ms in (("backbone", lins), ("heads", heads)):
    p = sum(m.in_features * m.out_features for m in ms)
    print(f"{name}: {len(ms)} linears, {p / 1e6:.2f} M weights, kinds {sorted({weight_kind(m) for m in ms})}, "
          f"{2 * p / 1e6:.1f} MB in bf16")
xs = {m: torch.randn(8, m.in_features) for m in lins + heads}


def linears(ms):
    for m in ms:
        m(xs[m])


with torch.inference_mode():
    for threads in (2, 1, 2, 1):
        torch.set_num_threads(threads)
        times = {"draft call": [], "backbone linears": [], "head linears": []}
        for _ in range(5):
            inner.draft(reqs, n, lookup=[([], [])])
        for _ in range(200):
            for key, fn in (("draft call", lambda: inner.draft(reqs, n, lookup=[([], [])])),
                            ("backbone linears", lambda: linears(lins)), ("head linears", lambda: linears(heads))):
                t = time.perf_counter()
                fn()
                times[key].append(time.perf_counter() - t)
        print(f"{threads} thread(s): " + ", ".join(f"{k} {1e3 * statistics.median(v):.3f} ms" for k, v in times.items()))
