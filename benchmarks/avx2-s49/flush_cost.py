"""The drafter catch-up (ContextFeed.flush -> append_context) timed by how many tokens it feeds: the default at one request, 12 held-out prompts.

    python3 benchmarks/avx2-s49/flush_cost.py
"""
import time, statistics
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import SpeculativeConfig, DEFAULT_SPECULATIVE
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams
t = Target.load("default", dtype="auto", device="cpu", max_len=2048)
prompts = [t.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", 12)]
e = LLMEngine(t, SpeculativeConfig(**DEFAULT_SPECULATIVE), EngineConfig(max_num_seqs=1, max_model_len=2048))
feed = e.runner.feed; dr = e.runner.drafter
rec = []
orig_flush = feed.flush; orig_app = dr.append_context
cur = {}
def app(*a, **k):
    t0 = time.perf_counter(); r = orig_app(*a, **k); cur["app"] = time.perf_counter() - t0; cur["n"] = sum(len(x) for x in a[1]); return r
def flush(ids):
    cur.clear(); parts = sum(len(feed.pending.get(i, [])) for i in ids)
    t0 = time.perf_counter(); r = orig_flush(ids); dt = time.perf_counter() - t0
    if "n" in cur: rec.append((cur["n"], parts, dt, cur["app"]))
    return r
feed.flush = flush; dr.append_context = app
e.generate(prompts, SamplingParams(max_tokens=96, ignore_eos=True))
for n, parts, dt, a in sorted(rec)[:: max(1, len(rec)//15)]:
    print(f"tokens {n:4d} parts {parts:3d} flush {dt*1e3:6.2f} ms  append_context {a*1e3:6.2f} ms  per token {a/n*1e6:5.1f} us")
print("calls", len(rec), "total flush ms", round(sum(r[2] for r in rec)*1e3,1), "append", round(sum(r[3] for r in rec)*1e3,1))
