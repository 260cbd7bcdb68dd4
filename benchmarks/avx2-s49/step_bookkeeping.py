"""perf_counter timing of speculation's bookkeeping per step, default vs plain, engines
stepped in turn, C requests at a time (default 1; step_bookkeeping_c4.txt: 4).

    python3 benchmarks/avx2-s49/step_bookkeeping.py [C]
"""
import sys, time, collections, functools
import torch
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import SpeculativeConfig, DEFAULT_SPECULATIVE
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams
import dspark.engine.runner as R
C = int(sys.argv[1]) if len(sys.argv) > 1 else 1
import dspark.engine.draft_choice as DC

acc = collections.defaultdict(lambda: [0.0, 0])
cur = ["?"]
def wrap(obj, name, label):
    f = getattr(obj, name)
    @functools.wraps(f)
    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            e = acc[(cur[0], label)]; e[0] += time.perf_counter() - t; e[1] += 1
    setattr(obj, name, g)

target = Target.load("default", dtype="auto", device="cpu", max_len=2048)
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", 12 * C)]
specs = {"plain": None, "default": DEFAULT_SPECULATIVE}
engines = {k: LLMEngine(target, v and SpeculativeConfig(**v), EngineConfig(max_num_seqs=C, max_model_len=2048)) for k, v in specs.items()}
for name in ["_verify_lengths", "_prepare", "_verify", "_observe", "_commit", "step"]:
    wrap(R.SpecRunner, name, name)
wrap(LLMEngine, "step", "engine.step")
r = engines["default"].runner
for obj, name in [(r.policy, "should_draft"), (r.policy, "choose"), (r.drafter, "lookup_only"), (r.drafter, "draft"), (r.feed, "flush"), (r.drafter, "record_verification"), (r.calibration, "observe")]:
    wrap(obj, name, name)
wrap(DC, "free_lengths", "free_lengths"); wrap(DC, "merge_drafts", "merge_drafts")
e = engines["default"]
for obj, name in [(e.governor, "speculating"), (e.governor, "record"), (e.live_table, "record"), (e.live_table, "record_outside"), (e.step_watch, "record"), (r.feed, "stash"), (r.feed, "let_go"), (r, "_keep_prompt"), (r.gate, "wants_draft"), (r.lookup_gate, "wants_draft"), (r.gate, "record"), (r.lookup_gate, "record"), (DC, "faulty_rows"), (e._profile, "target_time")]:
    if obj is not None and hasattr(obj, name): wrap(obj, name, type(obj).__name__ + "." + name)
import dspark.engine.engine as E
wrap(E, "StepRecord", "StepRecord") if hasattr(E, "StepRecord") else None
wrap(target.model, "forward", "target.forward") if False else None
params = SamplingParams(max_tokens=96, ignore_eos=True)
for k, e in engines.items():
    cur[0] = k; e.generate(prompts[:1], SamplingParams(max_tokens=8, ignore_eos=True))
acc.clear()
steps = collections.Counter(); tgt = collections.Counter()
for i in range(1, len(prompts), C):
    for e in engines.values():
        for p in prompts[i:i + C]: e.add_request(p, params)
    while any(e.has_unfinished() for e in engines.values()):
        for k, e in engines.items():
            if e.has_unfinished():
                cur[0] = k; e.step(); steps[k] += 1; tgt[k] += e.runner.last_target_seconds
for k in engines:
    print(f"== {k}: {steps[k]} steps, target {1e3*tgt[k]/steps[k]:.2f} ms/step")
    for (c, lab), (t, n) in sorted(acc.items(), key=lambda x: -x[1][0]):
        if c == k:
            print(f"  {lab:22s} {1e3*t/steps[k]:7.3f} ms/step  {1e6*t/max(n,1):8.1f} us/call  {n} calls")
