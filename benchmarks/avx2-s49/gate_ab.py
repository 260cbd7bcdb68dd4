"""The lookup gates at one request: each configuration with its gates at every load
(`*-gated`, as before LOOKUP_GATE_FROM) and as shipped (gated from 2 requests; the
same at one request as the 4 this first ran with), beside plain decoding: engines
stepped in turn, held-out prompts, 96 tokens. `--model` and `--dtype` as in
scripts/bench_lockstep.py.

    python3 benchmarks/avx2-s49/gate_ab.py [--configs ...] [--model PATH] [--dtype auto] [--prompts 16] [--rounds 2]

ngram_gate_ab*.txt: the default --configs. default_gate_ab*.txt: --configs
plain,lookup3-gated,default-gated,default (there named lookup3, default and
default-nogate). priced_gate_ab.txt: --configs plain,lookup3-gated,priced-gated,priced
(there named lookup3, priced and priced-nogate).
"""
import argparse
import time

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
ap.add_argument("--configs", default="plain,lookup3-gated,lookup3,priced-gated,priced")
args = ap.parse_args()
t = Target.load(args.model, dtype=args.dtype, device="cpu", max_len=2048)
prompts = [t.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", args.prompts)]
priced = {"method": "ngram", "enable_adaptive_verification": True}
known = {"plain": None, "lookup3": LOOKUP_DEFAULT, "priced": priced, "default": DEFAULT_SPECULATIVE}
configs = [(name, known[name.removesuffix("-gated")]) for name in args.configs.split(",")]
engines = {}
for name, spec in configs:
    e = LLMEngine(t, spec and SpeculativeConfig(**spec), EngineConfig(max_num_seqs=1, max_model_len=2048))
    if name.endswith("-gated"):
        e.runner.draft_gate_from = e.runner.lookup_gate_from = 1
    engines[name] = e
secs = {k: 0.0 for k in engines}
params = SamplingParams(max_tokens=96, ignore_eos=True)
order = list(engines)
for r in range(args.rounds):
    for i, p in enumerate(prompts):
        for e in engines.values():
            e.add_request(p, params)
        while any(e.has_unfinished() for e in engines.values()):
            for k in order:
                e = engines[k]
                if e.has_unfinished():
                    t0 = time.perf_counter()
                    e.step()
                    secs[k] += time.perf_counter() - t0
            order.reverse()
for k, e in engines.items():
    st = e.total_stats()
    print(f"{k:14s} x plain {secs['plain'] / secs[k]:.3f}  tau {st.acceptance_length:.3f}  "
          f"gate skips {e.runner.gate.skipped + e.runner.lookup_gate.skipped}")
