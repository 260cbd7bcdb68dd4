"""The top-64 selection of a draft, native kernel against torch.topk: on rows of draft
logits taken from a running engine (DSpark alone, one request, greedy), 7 rows a call
as a one-request draft makes it, each call on rows just written (hot, as in a draft), and
on random rows of a sixteen-request draft (112 rows). Checks that both select the same.

    python3 benchmarks/amx-s55/topk_rows.py
"""
import time

import torch

import dspark.drafters.dspark as dd
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import DEFAULT_SPECULATIVE, SpeculativeConfig
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.cpu_kernels import topk_rows
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams

target = Target.load("default", dtype="auto", device="cpu", max_len=2048)
engine = LLMEngine(target, SpeculativeConfig(**dict(DEFAULT_SPECULATIVE, lookup=False)),
                   EngineConfig(max_num_seqs=1, max_model_len=2048))
engine.governor = engine.drafter_governor = None  # draft on every step
rows = []
dd.topk_rows = lambda x, k: (rows.append(x.detach().clone()), topk_rows(x, k))[1]
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", 4)]
engine.generate(prompts, SamplingParams(max_tokens=64, ignore_eos=True))
calls = [torch.tensor(r.reshape(1, -1, r.shape[-1]).numpy()) for r in rows]  # ordinary tensors (not inference ones)
for c in calls:
    assert torch.equal(topk_rows(c, 64)[1], c.topk(64, dim=-1).indices)


def per_call(fn, batches) -> float:
    t0 = time.perf_counter()
    for b in batches:
        b.add_(0)  # the rows just written, as the LM head leaves them
        fn(b)
    return (time.perf_counter() - t0) / len(batches) * 1e6


for _ in range(2):
    touch = per_call(lambda b: None, calls)
    native = per_call(lambda b: topk_rows(b, 64), calls) - touch
    ref = per_call(lambda b: b.topk(64, dim=-1), calls) - touch
    print(f"{len(calls)} one-request drafts of {calls[0].shape[1]} rows (real logits): native {native:.0f} us, "
          f"torch {ref:.0f} us a call")
wide = [torch.randn(16, 7, 8192) for _ in range(20)]
print(f"sixteen requests (112 random rows): native {per_call(lambda b: topk_rows(b, 64), wide) / 1e3:.2f} ms, "
      f"torch {per_call(lambda b: b.topk(64, dim=-1), wide) / 1e3:.2f} ms a call")
