"""Held-plain default against plain decoding at C requests, engines stepped in turn: time outside the target forward, by component.

    python3 benchmarks/avx512bf16-s45/outside.py 16 400
"""
import sys, time, statistics, functools
from collections import defaultdict
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import SpeculativeConfig, DEFAULT_SPECULATIVE
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams
C = int(sys.argv[1]) if len(sys.argv) > 1 else 16
target = Target.load("default", dtype="auto", device="cpu", max_len=2048, log=print)
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", 64)]
acc = defaultdict(float)
def timed(obj, name, key):
    f = getattr(obj, name)
    @functools.wraps(f)
    def w(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[key] += time.perf_counter() - t; return r
    setattr(obj, name, w)
lanes = {}
for name in ["plain", "default"]:
    spec = SpeculativeConfig(**DEFAULT_SPECULATIVE) if name == "default" else None
    e = LLMEngine(target, spec, EngineConfig(max_num_seqs=C, max_model_len=2048))
    e.generate(prompts[:C], SamplingParams(max_tokens=8, ignore_eos=True))
    if e.governor is not None:
        e.governor.speculating = lambda n: False
        timed(e.governor, "record", "governor.record")
        timed(e.live_table, "record", "live.record")
        timed(e.live_table, "record_outside", "live.record_outside")
        timed(e.live_table, "publish", "live.publish"); timed(e.live_table, "fold", "live.fold"); timed(e.live_table.target, "ms", "live.target.ms"); timed(e.live_table.table, "set_live_ms", "table.set_live_ms"); timed(e.live_table.target, "ratio", "live.target.ratio"); timed(e.live_table.target, "_log_estimate", "live.target._log_estimate"); timed(e.live_table.target, "observe", "live.target.observe")
        timed(e.runner.feed, "let_go", "feed.let_go")
        timed(e.runner.feed, "stash", "feed.stash")
    timed(e.step_watch, "record", f"{name}.watch")
    timed(e.runner, "_commit", f"{name}._commit")
    timed(e.runner, "_prepare", f"{name}._prepare")
    timed(e.runner, "_verify", f"{name}._verify")
    timed(e.runner, "_verify_lengths", f"{name}._verify_lengths")
    for p in prompts[:C]:
        e.add_request(p, SamplingParams(max_tokens=1000, ignore_eos=True))
    for _ in range(5): e.step()
    lanes[name] = (e, [])
acc.clear()
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 300):
    for name, (e, out) in lanes.items():
        t = time.perf_counter(); e.step(); dt = time.perf_counter() - t
        out.append((dt, e.runner.last_target_seconds))
N = len(lanes["plain"][1])
for name, (e, out) in lanes.items():
    print(f"{name:8} step {statistics.median(x[0] for x in out)*1e3:.2f} ms  target {statistics.median(x[1] for x in out)*1e3:.2f}  outside median {statistics.median(x[0]-x[1] for x in out)*1e3:.3f} mean {statistics.mean(x[0]-x[1] for x in out)*1e3:.3f} ms")
for k, v in sorted(acc.items()):
    print(f"  {k:28} {v/N*1e6:8.1f} us/step")
e = lanes["default"][0]
lv = e.live_table
print("counts", len(lv.target._counts), "drafter", lv.drafter is not None and len(lv.drafter._counts))
import random
N=1000
t0=time.perf_counter()
for i in range(N): lv.record(16, 0.027*random.uniform(0.95,1.05))
print("record isolated", (time.perf_counter()-t0)/N*1e6, "us")
