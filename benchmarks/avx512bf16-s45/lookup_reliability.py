"""At concurrency C, the default held in speculation: the lookup tokens the scheduler admits,
their predicted survivals against what verification accepted (by survival bin and by
position), and the table's step time against the measured one.

    python3 benchmarks/avx512bf16-s45/lookup_reliability.py 16 [odds]

`odds`: the lookup trust scales its factor up by odds (`RequestTrust.odds_up`)."""
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
_lo = e.runner.drafter.lookup_only
def lo_spy(ids, ctxs, n):
    captured["ids"] = list(ids); return _lo(ids, ctxs, n)
e.runner.drafter.lookup_only = lo_spy
e.runner.drafter.trust.odds_up = "odds" in sys.argv
pending = list(prompts)[::-1]
pred, acc, B, tt, meas, fw = [], [], [], [], [], []
REL = []
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
    looked = [i for i, l in enumerate(lens) if l > 0]
    for j in range(len(L)):
        for k in range(L[j]):
            by_pos.setdefault(k, []).append(s[j, k])
    gotd = {o.seq.request_id: len(o.new_tokens) - 1 for o in out}
    lend = {d.request_id: l for d, l in zip(decodes, lens)}
    if "ids" in captured and len(captured["ids"]) == s.shape[0]:
        REL.append((s.copy(), [lend[i] for i in captured["ids"]], [gotd[i] for i in captured["ids"]]))
rel = []
print(f"C={C} steps={len(B)} mean admitted lookup tokens/step {np.mean(B):.2f}; predicted accepted {np.mean(pred):.2f}, "
      f"actual accepted {np.mean(acc):.2f}")
print(f"target time measured {np.median(meas)*1e3:.2f} ms vs profile {np.median(tt)*1e3:.2f} ms; plain T({C}) {e._profile.target_time(C)*1e3:.2f}")
for k in sorted(by_pos):
    print(f"  position {k+1}: n={len(by_pos[k])} mean survival {np.mean(by_pos[k]):.3f}")
print("hybrid counts", getattr(e.runner.drafter, "counts", None))

# reliability: rows of s are the looked-up decodes in order; lens/got are per decode; the
# looked rows are the decodes in order (lookup-only steps), so row j <-> decode j when all looked
pairs = []
for s_, lens_, got_ in REL:
    for j in range(len(lens_)):
        for k in range(lens_[j]):
            pairs.append((float(s_[j, k]), 1.0 if got_[j] > k else 0.0, k))
pairs = np.array(pairs)
print("pairs", len(pairs))
for lo, hi in [(0, .3), (.3, .5), (.5, .6), (.6, .7), (.7, .8), (.8, .9), (.9, .95), (.95, 1.01)]:
    m = (pairs[:, 0] >= lo) & (pairs[:, 0] < hi)
    if m.any():
        print(f"  survival {lo:.2f}-{hi:.2f}: n={m.sum():5d} predicted {pairs[m,0].mean():.3f} observed {pairs[m,1].mean():.3f}")
for k in range(7):
    m = pairs[:, 2] == k
    if m.any():
        print(f"  position {k+1}: n={m.sum():5d} predicted {pairs[m,0].mean():.3f} observed {pairs[m,1].mean():.3f}")
