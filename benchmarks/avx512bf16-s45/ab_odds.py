"""Held in speculation, the lookup trust scaled up by odds (`RequestTrust.odds_up`) against linearly, and plain decoding: engines stepped in turn.

    python3 benchmarks/avx512bf16-s45/ab_odds.py CONCURRENCY NUM_PROMPTS REPEATS
"""
import sys, json, statistics
import os
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
from bench_lockstep import Lane
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import SpeculativeConfig, DEFAULT_SPECULATIVE
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams
C = int(sys.argv[1]); N = int(sys.argv[2]); R = int(sys.argv[3])
target = Target.load("default", dtype="auto", device="cpu", max_len=2048)
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", N)]
params = SamplingParams(max_tokens=96, ignore_eos=True)
names = ["plain", "odds", "linear"]
res = {n: [] for n in names}
for rep in range(R):
    order = names[rep % 3:] + names[:rep % 3]
    lanes = []
    for name in order:
        spec = None if name == "plain" else SpeculativeConfig(**DEFAULT_SPECULATIVE)
        e = LLMEngine(target, spec, EngineConfig(max_num_seqs=C, max_model_len=2048))
        e.generate(prompts[:C], SamplingParams(max_tokens=8, ignore_eos=True))
        if spec is not None:
            e.governor.speculating = lambda n: True
            e.runner.drafter.trust.odds_up = name == "odds"
        lanes.append(Lane(name, e, prompts, params, C))
    while not all(l.done() for l in lanes):
        for l in lanes:
            if not l.done(): l.step()
    t = {l.name: l.seconds for l in lanes}
    for l in lanes:
        res[l.name].append(t["plain"] / l.seconds)
    print(f"repeat {rep+1}: " + "  ".join(f"{l.name} x{t['plain']/l.seconds:.3f} ({l.speculated}/{l.steps} spec)" for l in lanes), flush=True)
for n in names:
    print(f"{n:8} x plain {statistics.median(res[n]):.3f} [{min(res[n]):.3f}-{max(res[n]):.3f}]")
