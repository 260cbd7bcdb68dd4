"""At concurrency C, the default held in speculation: the lookup tokens the scheduler admits,
their predicted survivals against what verification accepted, and the table's step time
against the measured one."""
import sys, time, statistics
import numpy as np
import dspark.engine.runner as runner_mod
import dspark.schedule.policies as pol
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import SpeculativeConfig, DEFAULT_SPECULATIVE
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams

C = int(sys.argv[1]) if len(sys.argv) > 1 else 16
captured = {}
orig = pol.free_lengths
def spy(survival, table):
    out = orig(survival, table)
    captured["s"] = np.asarray(pol.as_survival(survival))
    captured["L"] = list(out)
    return out
runner_mod.free_lengths = spy
target = Target.load("default", dtype="auto", device="cpu", max_len=2048, log=print)
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", 64)]
params = SamplingParams(max_tokens=96, ignore_eos=True)
e = LLMEngine(target, SpeculativeConfig(**DEFAULT_SPECULATIVE), EngineConfig(max_num_seqs=C, max_model_len=2048))
e.generate(prompts[:C], SamplingParams(max_tokens=8, ignore_eos=True))
e.governor.speculating = lambda n: True
pending = list(prompts)[::-1]
pred, acc, B, tt, meas, fw = [], [], [], [], [], []
by_pos = {}
while pending or e.has_unfinished():
    while pending and len(e.running) + len(e.waiting) < C:
        e.add_request(pending.pop(), params)
    decodes = [s for s in e.running if s.prefilled]
    pure = not e.waiting and all(s.prefilled for s in e.running) and len(decodes) == C
    captured.clear()
    before = {s.request_id: len(s.output_ids) for s in decodes}
    out = e.step()
    r = e.runner
    if not pure or r.last_drafted_requests or "s" not in captured:
        continue
    s, L = captured["s"], captured["L"]
    # rows of s are in `order` = looked rows; map via verify lengths (lookup only: rows == looked)
    lens = [l for l in r.last_verify_lengths]
    got = [len(o.new_tokens) - 1 for o in out]
    b = sum(lens)
    B.append(b)
    pred.append(sum(s[j, :L[j]].sum() for j in range(len(L))))
    acc.append(sum(got))
    meas.append(r.last_target_seconds)
    tt.append(e._profile.target_time(r.last_forward_tokens))
    for j in range(len(L)):
        for k in range(L[j]):
            by_pos.setdefault(k, []).append(s[j, k])
print(f"C={C} steps={len(B)} mean admitted lookup tokens/step {np.mean(B):.2f}; predicted accepted {np.mean(pred):.2f}, "
      f"actual accepted {np.mean(acc):.2f}")
print(f"target time measured {np.median(meas)*1e3:.2f} ms vs profile {np.median(tt)*1e3:.2f} ms; plain T({C}) {e._profile.target_time(C)*1e3:.2f}")
for k in sorted(by_pos):
    print(f"  position {k+1}: n={len(by_pos[k])} mean survival {np.mean(by_pos[k]):.3f}")
print("hybrid counts", getattr(e.runner.drafter, "counts", None))
