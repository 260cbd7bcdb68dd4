"""At one request, held in speculation: the drafter's draft call and the target's step,
broken down by operator (torch.profiler), on the default configuration.

    python3 benchmarks/avx2-s46/draft_ops.py
"""
import sys, time, functools
from collections import defaultdict
import torch
from torch.profiler import profile, ProfilerActivity
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import SpeculativeConfig, DEFAULT_SPECULATIVE
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams

target = Target.load("default", dtype="auto", device="cpu", max_len=2048)
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", 16)]
e = LLMEngine(target, SpeculativeConfig(**DEFAULT_SPECULATIVE), EngineConfig(max_num_seqs=1, max_model_len=2048))
e.generate(prompts[:1], SamplingParams(max_tokens=8, ignore_eos=True))
e.governor.speculating = lambda n: True
d = e.runner.drafter
inner = d.inner
acc = defaultdict(float); calls = defaultdict(int)
def timed(obj, name, key):
    f = getattr(obj, name)
    @functools.wraps(f)
    def w(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[key] += time.perf_counter() - t; calls[key] += 1; return r
    setattr(obj, name, w)
timed(inner, "draft", "inner.draft")
timed(inner, "_native_backbone", "  backbone")
timed(inner, "head_logits", "  head_logits")
timed(inner, "append_context", "append_context")
timed(e.runner, "_verify_lengths", "_verify_lengths")
timed(e, "step", "engine.step")
params = SamplingParams(max_tokens=96, ignore_eos=True)
mode = sys.argv[1] if len(sys.argv) > 1 else "time"
def run(ps):
    for p in ps:
        e.add_request(p, params)
        while e.has_unfinished():
            e.step()
if mode == "prof":
    run(prompts[1:3])
    acc.clear(); calls.clear()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run(prompts[3:6])
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
else:
    run(prompts[1:16])
for k in acc:
    print(f"{k:24s} {calls[k]:6d} calls {1e3 * acc[k] / max(calls[k], 1):8.3f} ms/call")
