"""Per-step trace of a governed configuration stepped in turn with plain decoding at C
requests: each step's mode, requests, context tokens, tokens emitted and seconds, for
both engines, written as JSON lines; then the governed engine's speculative and
plain-mode steps against plain decoding's steps taken at the same moments.

    python3 benchmarks/avx2-s51/governor_trace.py CONFIG C PROMPTS OUT.jsonl [MODEL] [SPREAD]

SPREAD: each prompt's length drawn from 96 x [1 - SPREAD, 1 + SPREAD] as
scripts/bench_lockstep.py --length-spread draws it (default 0: all 96).
"""
import json
import random
import sys
import time

sys.path.insert(0, "scripts")
from bench_lockstep import CONFIGS  # noqa: E402

from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import SpeculativeConfig
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams

name, C, N, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
model = sys.argv[5] if len(sys.argv) > 5 else "default"
spread = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
target = Target.load(model, dtype="auto", device="cpu", max_len=2048)
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", N)]
rng = random.Random(0)
params = [SamplingParams(max_tokens=max(1, round(96 * (1 + spread * rng.uniform(-1, 1)))), ignore_eos=True)
          for _ in prompts]
engines = {}
for k, cfg in (("plain", None), (name, CONFIGS[name])):
    e = LLMEngine(target, cfg and SpeculativeConfig(**cfg), EngineConfig(max_num_seqs=C, max_model_len=2048))
    e.generate(prompts[:C], SamplingParams(max_tokens=8, ignore_eos=True))
    engines[k] = [e, list(zip(prompts, params))[::-1]]
rows = []
rnd = 0
while any(p or e.has_unfinished() for e, p in engines.values()):
    for k in (list(engines) if rnd % 2 == 0 else list(engines)[::-1]):
        e, pending = engines[k]
        if not pending and not e.has_unfinished():
            continue
        while pending and len(e.running) + len(e.waiting) < C:
            e.add_request(*pending.pop())
        prefill = any(not s.prefilled for s in list(e.running) + list(e.waiting))
        decodes = [s for s in e.running if s.prefilled]
        ctx = sum(s.num_tokens for s in decodes)
        t = time.perf_counter()
        o = e.step()
        dt = time.perf_counter() - t
        lv = e.governor.level(max(1, len(decodes))) if e.governor is not None and e.governor.governs(max(1, len(decodes))) else None
        rows.append({"engine": k, "round": rnd, "prefill": prefill, "n": len(decodes), "ctx": ctx,
                     "spec": bool(e.runner.speculating) if e.governor is not None else False,
                     "trial": bool(lv is not None and lv.trialing),
                     "verify": sum(e.runner.last_verify_lengths),
                     "emitted": sum(len(x.new_tokens) for x in o), "s": dt,
                     "target_s": e.runner.last_target_seconds, "forward_tokens": e.runner.last_forward_tokens})
    rnd += 1
with open(out, "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
print(json.dumps(engines[name][0].governor.summary()) if engines[name][0].governor else "no governor")
