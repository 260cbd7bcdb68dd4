"""What DSparkAsync read when it decided to skip the drafter at one request: the live
drafter time, T(1), T(2), T(4) and the lagged gain, every 40th decision.

    python3 benchmarks/avx2-s46/skip_view.py
"""
import sys, collections, numpy as np
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import SpeculativeConfig, DEFAULT_SPECULATIVE
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams
target = Target.load("default", dtype="auto", device="cpu", max_len=2048)
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", 12)]
e = LLMEngine(target, SpeculativeConfig(**DEFAULT_SPECULATIVE), EngineConfig(max_num_seqs=1, max_model_len=2048))
pol = e.runner.policy
print(type(pol).__name__, "gate", type(e.runner.gate).__name__)
orig = pol.should_draft
log = []
def sd(R, n):
    r = orig(R, n)
    t = pol.table
    lag = pol._history[0][0] if len(pol._history) >= pol.lag else None
    log.append((r, pol.probing, t.drafter_time(1), t.target_time(1), t.target_time(2), t.target_time(4), None if lag is None else lag[1:4].tolist()))
    return r
pol.should_draft = sd
params = SamplingParams(max_tokens=96, ignore_eos=True)
for p in prompts:
    e.add_request(p, params)
    while e.has_unfinished(): e.step()
print("should_draft calls", len(log), "true", sum(x[0] for x in log), "probing", sum(x[1] for x in log))
for x in log[::40]: print(x[0], x[1], " drafter %.2f ms T1 %.2f T2 %.2f T4 %.2f" % tuple(1e3*v for v in x[2:6]), "lagged cum gain", x[6])
d = e.runner.drafter
print("hybrid counts", dict(d.counts))
print("gate", getattr(e.runner.gate, "__dict__", {}).keys())
