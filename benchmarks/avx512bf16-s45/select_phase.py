"""Held in speculation at C requests: where a step's time choosing what to verify goes
(lookup proposals, merging, pricing, the rest of `_verify_lengths`), timed in place.

    python3 benchmarks/avx512bf16-s45/select_phase.py 4 [prompts] [parts]
"""
import sys, time, functools, statistics
from collections import defaultdict
import dspark.engine.runner as runner_mod
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import SpeculativeConfig, DEFAULT_SPECULATIVE
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams

C = int(sys.argv[1]) if len(sys.argv) > 1 else 4
acc = defaultdict(float)
def timed(obj, name, key):
    f = getattr(obj, name)
    @functools.wraps(f)
    def w(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[key] += time.perf_counter() - t; return r
    setattr(obj, name, w)
target = Target.load("default", dtype="auto", device="cpu", max_len=2048)
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 64)]
e = LLMEngine(target, SpeculativeConfig(**DEFAULT_SPECULATIVE), EngineConfig(max_num_seqs=C, max_model_len=2048))
e.generate(prompts[:C], SamplingParams(max_tokens=8, ignore_eos=True))
e.governor.speculating = lambda n: True
d = e.runner.drafter
timed(d, "lookup_only", "lookup_only")
timed(d, "_propose", "  _propose (per request)")
timed(d.history, "suffix_index", "    suffix_index")
timed(d.calibration, "confidence", "    calibration.confidence")
timed(d.trust, "adjust", "    trust.adjust")
timed(runner_mod, "merge_drafts", "merge_drafts")
timed(runner_mod, "free_lengths", "free_lengths")
timed(e.runner, "_verify_lengths", "_verify_lengths (all)")
timed(d, "record_verification", "record_verification")
timed(d, "draft", "drafter.draft (hybrid)")
timed(e.runner.feed, "flush", "feed.flush (context to the drafter)")
timed(e.runner.policy, "choose", "policy.choose")
timed(e.runner.policy, "should_draft", "policy.should_draft")
timed(runner_mod, "faulty_rows", "faulty_rows")
if "parts" in sys.argv:  # the pricing's own parts
    import dspark.schedule.policies as pol
    timed(pol, "as_survival", "    as_survival")
    timed(pol, "admission_order", "    admission_order")
    timed(e.runner.policy.table, "admission_times", "    table.admission_times")
    timed(e.runner.policy, "_rates", "    policy._rates")
params = SamplingParams(max_tokens=96, ignore_eos=True)
pending = list(prompts)[::-1]
steps = 0
kinds = {}
while pending or e.has_unfinished():
    while pending and len(e.running) + len(e.waiting) < C:
        e.add_request(pending.pop(), params)
    e.step(); steps += 1
    r = e.runner
    kind = "drafted" if r.last_drafted_requests else ("looked" if r.last_speculated else "none")
    kinds[kind] = kinds.get(kind, 0) + 1
print(f"C={C}: {steps} steps {kinds}; per step:")
for k, v in acc.items():
    print(f"  {k:34} {v / steps * 1e6:8.1f} us")
