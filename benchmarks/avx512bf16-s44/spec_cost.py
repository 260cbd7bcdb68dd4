"""Spec-mode steps that draft nothing vs plain steps: per-step phases, engines stepped in turn."""
import sys, time, statistics, json
from collections import defaultdict
import torch
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import SpeculativeConfig, DEFAULT_SPECULATIVE
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams

C = int(sys.argv[1]) if len(sys.argv) > 1 else 16
cfgname = sys.argv[2] if len(sys.argv) > 2 else "dspark"
target = Target.load("default", dtype="auto", device="cpu", max_len=2048, log=print)
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", 64)]
params = SamplingParams(max_tokens=96, ignore_eos=True)
cfgs = {"plain": None, "dspark": dict(DEFAULT_SPECULATIVE, lookup=False), "default": DEFAULT_SPECULATIVE}
lanes = {}
for name in ["plain", cfgname]:
    spec = SpeculativeConfig(**cfgs[name]) if cfgs[name] else None
    e = LLMEngine(target, spec, EngineConfig(max_num_seqs=C, max_model_len=2048))
    e.generate(prompts[:C], SamplingParams(max_tokens=8, ignore_eos=True))
    if e.governor is not None:
        e.governor.speculating = (lambda n: False) if "held-plain" in sys.argv else (lambda n: True)
    lanes[name] = dict(e=e, pending=list(prompts)[::-1], ph=defaultdict(list))
def done(l): return not l["pending"] and not l["e"].has_unfinished()
while not all(done(l) for l in lanes.values()):
    for name, l in lanes.items():
        if done(l): continue
        e = l["e"]
        while l["pending"] and len(e.running) + len(e.waiting) < C:
            e.add_request(l["pending"].pop(), params)
        decodes = [s for s in e.running if s.prefilled]
        pure = not e.waiting and all(s.prefilled for s in e.running)
        t = time.perf_counter(); out = e.step(); dt = time.perf_counter() - t
        if not pure or len(decodes) != C: continue
        r = e.runner
        key = "drafted" if r.last_drafted_requests else ("spec" if r.last_speculated else "none")
        l["ph"][key].append((dt, r.last_target_seconds, r.last_draft_seconds, r.last_select_seconds))
for name, l in lanes.items():
    for k, v in l["ph"].items():
        med = [statistics.median(x[i] for x in v) * 1e3 for i in range(4)]
        tot = sum(x[0] for x in v)
        print(f"{name:8} {k:8} n={len(v):4} total {tot:.2f}s  median step {med[0]:.2f} target {med[1]:.2f} draft {med[2]:.2f} select {med[3]:.2f} other {med[0]-med[1]-med[2]-med[3]:.2f} ms")
