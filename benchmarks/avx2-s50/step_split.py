"""perf_counter timing of a step's pieces, plain decoding against the default at C
requests (default 1; engines stepped in turn), the default's steps split into those
that drafted, those that did not (lookup alone, or nothing) and, where the governor
holds the level plain, its plain-mode steps.

    python3 benchmarks/avx2-s50/step_split.py [prompts=12] [C=1]
"""
import collections
import functools
import sys
import time

from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import DEFAULT_SPECULATIVE, SpeculativeConfig
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams
import dspark.engine.runner as R
import dspark.engine.draft_choice as DC

N = int(sys.argv[1]) if len(sys.argv) > 1 else 12
C = int(sys.argv[2]) if len(sys.argv) > 2 else 1
step_acc = collections.defaultdict(float)
step_n = collections.Counter()


def wrap(obj, name, label):
    f = getattr(obj, name)

    @functools.wraps(f)
    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            step_acc[label] += time.perf_counter() - t
            step_n[label] += 1
    setattr(obj, name, g)


target = Target.load("default", dtype="auto", device="cpu", max_len=2048)
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", N * C + 1)]
engines = {k: LLMEngine(target, v and SpeculativeConfig(**v), EngineConfig(max_num_seqs=C, max_model_len=2048))
           for k, v in {"plain": None, "default": DEFAULT_SPECULATIVE}.items()}
for name in ["_verify_lengths", "_prepare", "_verify", "_observe", "_commit", "_lookup_lengths"]:
    wrap(R.SpecRunner, name, name)
wrap(DC, "free_lengths", "free_lengths")
wrap(DC, "merge_drafts", "merge_drafts")
wrap(DC, "faulty_rows", "faulty_rows")
e = engines["default"]
r = e.runner
for obj, name in [(r.policy, "should_draft"), (r.policy, "choose"), (r.drafter, "lookup_lists"), (r.drafter, "draft"),
                  (r.feed, "flush"), (r.feed, "stash"), (r.drafter, "record_verification"), (r.calibration, "observe"),
                  (e.governor, "speculating"), (e.governor, "record"), (e.live_table, "record"),
                  (e.live_table, "record_outside"), (e.step_watch, "record"), (e, "_append")]:
    wrap(obj, name, f"{type(obj).__name__}.{name}")
for k, eng in engines.items():
    eng.generate(prompts[:1], SamplingParams(max_tokens=8, ignore_eos=True))
acc = collections.defaultdict(lambda: collections.defaultdict(float))
calls = collections.defaultdict(collections.Counter)
steps = collections.Counter()
params = SamplingParams(max_tokens=96, ignore_eos=True)
for j in range(1, len(prompts), C):
    for eng in engines.values():
        for p in prompts[j:j + C]:
            eng.add_request(p, params)
    while any(eng.has_unfinished() for eng in engines.values()):
        for k, eng in engines.items():
            if not eng.has_unfinished():
                continue
            step_acc.clear()
            step_n.clear()
            prefill = any(not s.prefilled for s in list(eng.running) + list(eng.waiting))
            t = time.perf_counter()
            eng.step()
            total = time.perf_counter() - t
            if prefill:
                continue
            cat = k if k == "plain" else ("default, plain mode" if not eng.runner.speculating else
                                          "default, drafting" if eng.runner._num_drafted else "default, no draft")
            steps[cat] += 1
            acc[cat]["engine.step"] += total
            acc[cat]["target forward"] += eng.runner.last_target_seconds
            for lab, v in step_acc.items():
                acc[cat][lab] += v
                calls[cat][lab] += step_n[lab]
for cat in steps:
    a = acc[cat]
    outside = a["engine.step"] - a["target forward"]
    print(f"== {cat}: {steps[cat]} steps, target {1e3 * a['target forward'] / steps[cat]:.2f} ms/step, "
          f"outside it {1e3 * outside / steps[cat]:.3f} ms/step")
    for lab, v in sorted(a.items(), key=lambda x: -x[1]):
        if lab not in ("engine.step", "target forward"):
            print(f"  {lab:34s} {1e3 * v / steps[cat]:7.3f} ms/step  {calls[cat][lab] / steps[cat]:5.2f} calls/step")
