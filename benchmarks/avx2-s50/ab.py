"""Paired A/B at one request (or --concurrency N): engines of the named configurations
stepped in turn on the same held-out prompts (96 greedy tokens, ignore_eos), so the
machine's drift falls on all alike; per engine its time x plain decoding, acceptance
length, drafting steps, and its time outside the target's forward per step.

    python3 benchmarks/avx2-s50/ab.py [--configs plain,default,default@b01f0fe,plain-again]
        [--model default] [--prompts 16] [--rounds 2] [--concurrency 1]

Configurations: plain, plain-again (an A/A control), default (as shipped),
lookup3, and default@REV: the default with `DraftChoice._verify_lengths` (drafting,
lookup and the length choice) as of git revision REV.
"""
import argparse
import importlib.util
import subprocess
import tempfile
import time
import types
from pathlib import Path

from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import DEFAULT_SPECULATIVE, LOOKUP_DEFAULT, SpeculativeConfig
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="default")
ap.add_argument("--dtype", default="auto")
ap.add_argument("--prompts", type=int, default=16)
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--concurrency", type=int, default=1)
ap.add_argument("--configs", default="plain,default,default@b01f0fe,plain-again")
args = ap.parse_args()
t = Target.load(args.model, dtype=args.dtype, device="cpu", max_len=2048)
prompts = [t.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", args.prompts)]
KNOWN = {"plain": (None, {}), "plain-again": (None, {}), "default": (DEFAULT_SPECULATIVE, {}),
         "lookup3": (LOOKUP_DEFAULT, {})}


def verify_lengths_at(rev: str):
    """DraftChoice._verify_lengths as of `rev`."""
    src = subprocess.run(["git", "show", f"{rev}:dspark/engine/draft_choice.py"], capture_output=True, text=True,
                         check=True).stdout
    path = Path(tempfile.mkdtemp()) / "draft_choice_before.py"
    path.write_text(src.replace("from .", "from dspark.engine."))
    spec = importlib.util.spec_from_file_location("draft_choice_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.DraftChoice._verify_lengths


engines, extra = {}, {}
for name in args.configs.split(","):
    base, _, rev = name.partition("@")
    spec, attrs = KNOWN[base]
    if rev:
        attrs = dict(attrs, _verify_lengths=verify_lengths_at(rev))
    e = LLMEngine(t, spec and SpeculativeConfig(**spec), EngineConfig(max_num_seqs=args.concurrency,
                                                                      max_model_len=2048))
    for k, v in attrs.items():
        setattr(e.runner, k, types.MethodType(v, e.runner) if callable(v) else v)
    engines[name] = e
    extra[name] = {"steps": 0, "drafting": 0, "target": 0.0, "other_steps": 0, "other_outside": 0.0}
secs = {k: 0.0 for k in engines}
params = SamplingParams(max_tokens=96, ignore_eos=True)
order = list(engines)
c = args.concurrency
for r in range(args.rounds):
    for i in range(0, len(prompts), c):
        for e in engines.values():
            for p in prompts[i:i + c]:
                e.add_request(p, params)
        while any(e.has_unfinished() for e in engines.values()):
            for k in order:
                e = engines[k]
                if e.has_unfinished():
                    t0 = time.perf_counter()
                    e.step()
                    dt = time.perf_counter() - t0
                    secs[k] += dt
                    x = extra[k]
                    x["steps"] += 1
                    drafted = e.runner._num_drafted > 0
                    x["drafting"] += drafted
                    x["target"] += e.runner.last_target_seconds
                    if not drafted:
                        x["other_steps"] += 1
                        x["other_outside"] += dt - e.runner.last_target_seconds
            order.reverse()
print(f"concurrency {c}, {len(prompts)} prompts x {args.rounds} rounds, {args.model}")
for k, e in engines.items():
    st = e.total_stats()
    x = extra[k]
    outside = (secs[k] - x["target"]) / x["steps"] * 1e3
    print(f"{k:18s} x plain {secs['plain'] / secs[k]:.3f}  {secs[k]:.2f} s  target {x['target'] / x['steps'] * 1e3:.2f} "
          f"ms/step  tau {st.acceptance_length:.3f}  steps {x['steps']:5d}  "
          f"drafting {x['drafting']:4d}  outside-target {outside:.2f} ms/step, "
          f"{x['other_outside'] / max(x['other_steps'], 1) * 1e3:.2f} on steps without a draft")
