"""Held in speculation at C requests: per lookup-only step, what the scheduler expected (tokens,
step time from its table) against what the step did, by admitted tokens B.

    python3 benchmarks/avx512bf16-s45/pricing.py 16
"""

import sys, time, statistics
import numpy as np
import dspark.engine.runner as runner_mod
import dspark.schedule.lookup_pricing as pol
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import SpeculativeConfig, DEFAULT_SPECULATIVE
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams
C = int(sys.argv[1]) if len(sys.argv) > 1 else 16
cap = {}
orig = pol.free_lengths
def spy(survival, table, others=0, other_tokens=0):
    out = orig(survival, table, others, other_tokens)
    s = np.asarray(pol.as_survival(survival))
    R = s.shape[0]
    B = int(sum(out))
    cap["exp"] = float(sum(s[j, :out[j]].sum() for j in range(R)))
    cap["B"] = B
    R0 = R + others + other_tokens
    cap["t0"] = float(table.admission_times(np.array([R0]), R, drafted=False, others=others, other_tokens=other_tokens)[0])
    cap["tB"] = float(table.admission_times(np.array([R0 + B]), R, drafted=False, others=others, other_tokens=other_tokens)[0])
    cap["ov"] = table.spec_overhead(R + others)
    return out
runner_mod.free_lengths = spy
target = Target.load("default", dtype="auto", device="cpu", max_len=2048)
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", 64)]
params = SamplingParams(max_tokens=96, ignore_eos=True)
e = LLMEngine(target, SpeculativeConfig(**DEFAULT_SPECULATIVE), EngineConfig(max_num_seqs=C, max_model_len=2048))
e.generate(prompts[:C], SamplingParams(max_tokens=8, ignore_eos=True))
e.governor.speculating = lambda n: True
pending = list(prompts)[::-1]
rows = []
while pending or e.has_unfinished():
    while pending and len(e.running) + len(e.waiting) < C:
        e.add_request(pending.pop(), params)
    decodes = [s for s in e.running if s.prefilled]
    pure = not e.waiting and all(s.prefilled for s in e.running) and len(decodes) == C
    cap.clear()
    t = time.perf_counter(); out = e.step(); dt = time.perf_counter() - t
    r = e.runner
    if not pure or r.last_drafted_requests or "B" not in cap:
        continue
    got = sum(len(o.new_tokens) for o in out) - C
    rows.append((cap["B"], cap["exp"], got, cap["t0"], cap["tB"], cap["ov"], r.last_target_seconds, dt))
a = np.array(rows)
print(f"C={C} lookup-only steps {len(a)}")
for lo, hi in [(0, 1), (1, 3), (3, 6), (6, 10), (10, 20), (20, 200)]:
    m = (a[:, 0] >= lo) & (a[:, 0] < hi)
    if not m.any(): continue
    x = a[m]
    print(f" B {lo:3d}-{hi:3d}: n={m.sum():4d} expected {x[:,1].mean():5.2f} got {x[:,2].mean():5.2f} | table: T(R) {x[:,3].mean()*1e3:6.2f} T(R+B)+ov {x[:,4].mean()*1e3:6.2f} (ov {x[:,5].mean()*1e3:.2f}) | measured target {np.median(x[:,6])*1e3:6.2f} step {np.median(x[:,7])*1e3:6.2f} ms")
