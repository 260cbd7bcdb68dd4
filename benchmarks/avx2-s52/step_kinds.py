"""One request at a time (engines stepped in turn, lengths 48-144 as bench_lockstep's
--length-spread 0.5): plain decoding, the default and priced lookup alone, each
engine's decode steps split by kind (drafted, looked up alone, nothing proposed), with
their count, tokens per step, target time and time outside the target per step.

    python3 benchmarks/avx2-s52/step_kinds.py [prompts=16]
"""
import collections
import random
import sys
import time

from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import DEFAULT_SPECULATIVE, LOOKUP_DEFAULT, SpeculativeConfig
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams

N = int(sys.argv[1]) if len(sys.argv) > 1 else 16
target = Target.load("default", dtype="auto", device="cpu", max_len=2048)
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", N)]
rng = random.Random(0)
lengths = [max(1, round(96 * (1 + 0.5 * rng.uniform(-1, 1)))) for _ in prompts]
configs = {"plain": None, "default": DEFAULT_SPECULATIVE, "lookup": LOOKUP_DEFAULT}
engines = {k: LLMEngine(target, v and SpeculativeConfig(**v), EngineConfig(max_num_seqs=1, max_model_len=2048))
           for k, v in configs.items()}
for eng in engines.values():
    eng.generate(prompts[:1], SamplingParams(max_tokens=8, ignore_eos=True))
# whether lookup matched at a step the default priced (drafted steps split by it)
matched = {"last": None}
hybrid = engines["default"].runner.drafter
priced = hybrid.survivals_with_and_without


def spy(*a, **k):
    out = priced(*a, **k)
    matched["last"] = None if out is None else any(s[0] > 0 for s in out[0])
    return out


hybrid.survivals_with_and_without = spy
acc = collections.defaultdict(lambda: [0, 0, 0.0, 0.0])  # steps, tokens, target s, outside s
total = collections.Counter()
for p, n in zip(prompts, lengths):
    for eng in engines.values():
        eng.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True))
    rnd = 0
    while any(e.has_unfinished() for e in engines.values()):
        items = list(engines.items())
        for k, eng in items if rnd % 2 == 0 else items[::-1]:
            if not eng.has_unfinished():
                continue
            prefill = any(not s.prefilled for s in list(eng.running) + list(eng.waiting))
            if k == "default":
                matched["last"] = None
            t = time.perf_counter()
            out = eng.step()
            dt = time.perf_counter() - t
            total[k] += dt
            if prefill:
                continue
            r = eng.runner
            probe = k == "default" and r.policy.probing
            kind = "plain" if k == "plain" else (
                ("drafted, probe" if probe else "drafted, lookup matched" if matched["last"] else
                 "drafted, no match") if getattr(r, "last_drafted_requests", 0) else
                "looked up" if sum(r.last_verify_lengths) or r.last_speculated else "nothing")
            a = acc[(k, kind)]
            a[0] += 1
            a[1] += sum(len(o.new_tokens) for o in out)
            a[2] += r.last_target_seconds
            a[3] += dt - r.last_target_seconds
        rnd += 1
for k in engines:
    print(f"== {k}: {total[k]:.2f} s in all, x{total['plain'] / total[k]:.3f} plain"
          + (f", priced out {engines[k].runner.priced_out}" if k == "default" else ""))
    for (kk, kind), (s, tok, tgt, out) in sorted(acc.items()):
        if kk == k:
            print(f"  {kind:10s} {s:5d} steps  {tok / s:5.2f} tokens/step  target {1e3 * tgt / s:6.2f} ms  "
                  f"outside {1e3 * out / s:5.2f} ms  -> {tok / (tgt + out):6.1f} tok/s")
