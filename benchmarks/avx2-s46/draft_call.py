"""One request's draft call, captured in a running engine and replayed: its time and its
operators (torch.profiler), the backbone and head apart.

    python3 benchmarks/avx2-s46/draft_call.py [prof]
"""
import sys, time, statistics
import torch
from torch.profiler import profile, ProfilerActivity
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import SpeculativeConfig, DEFAULT_SPECULATIVE
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams

target = Target.load("default", dtype="auto", device="cpu", max_len=2048)
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", 8)]
e = LLMEngine(target, SpeculativeConfig(**DEFAULT_SPECULATIVE), EngineConfig(max_num_seqs=1, max_model_len=2048))
e.governor.speculating = lambda n: True
inner = e.runner.drafter.inner
captured = []
orig = inner.draft
def spy(requests, num_tokens, lookup=None):
    captured.append((list(requests), num_tokens, lookup))
    return orig(requests, num_tokens, lookup=lookup)
inner.draft = spy
e.add_request(prompts[0], SamplingParams(max_tokens=400, ignore_eos=True))
while not captured and e.has_unfinished():
    e.step()
inner.draft = orig
reqs, n, lookup = captured[-1]
print("draft of", n, "tokens, context", inner._context_len[inner.slot(reqs[0].request_id)], "lookup", lookup)
def timeit(f, k=50):
    for _ in range(5): f()
    ts = []
    for _ in range(k):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3
print(f"draft (with lookup)  {timeit(lambda: orig(reqs, n, lookup=lookup)):.3f} ms")
print(f"draft (no lookup)    {timeit(lambda: orig(reqs, n)):.3f} ms")
for m in (1, 3):
    print(f"draft of {m}          {timeit(lambda: orig(reqs, m)):.3f} ms")
if "prof" in sys.argv:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            orig(reqs, n, lookup=lookup)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
if "parts" in sys.argv:
    import functools
    from collections import defaultdict
    import dspark.drafters.dspark as dmod
    acc = defaultdict(float)
    def timed(obj, name, key):
        f = getattr(obj, name)
        @functools.wraps(f)
        def w(*a, **k):
            t = time.perf_counter(); r = f(*a, **k); acc[key] += time.perf_counter() - t; return r
        setattr(obj, name, w)
    timed(inner, "_native_backbone", "backbone (native)")
    timed(inner, "head_logits", "head_logits")
    timed(inner.markov_head, "latent", "markov latent")
    timed(dmod, "choose_tokens", "choose_tokens")
    timed(inner.confidence_head, "forward", "confidence head")
    timed(inner, "_claim_draft", "_claim_draft")
    timed(inner.norm, "forward", "norm")
    timed(inner, "to_target_ids", "to_target_ids")
    timed(dmod, "_lookup_tensors", "_lookup_tensors")
    k = 50
    t = time.perf_counter()
    for _ in range(k):
        orig(reqs, n, lookup=lookup)
    total = (time.perf_counter() - t) / k
    print(f"draft with lookup, instrumented: {total * 1e3:.3f} ms")
    for key, v in acc.items():
        print(f"  {key:22} {v / k * 1e3:.3f} ms")
    print(f"  {'rest':22} {(total - sum(acc.values()) / k) * 1e3:.3f} ms")
