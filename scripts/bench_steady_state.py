"""Steady state at one load, without HTTP: the engine decodes held-out prompts with
continuous batching at --concurrency requests, for each configuration, the
configurations interleaved over rounds (round r starts at the (r mod n)-th), and
reports output tok/s and each configuration's ratio to plain decoding within each
round (median [min-max]).

A served sweep's points are short (a few hundred steps); this measures what a server
that has run for a while does: whatever the scheduler learns online (the live
step-time curve, lookup's earned confidence, the plain-decoding fallback) has had
time to settle.

    python3 scripts/bench_steady_state.py --concurrency 16 --num-prompts 200 --rounds 2
    python3 scripts/bench_steady_state.py --configs plain,default,fallback --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

DEFAULT = {"method": "dspark", "enable_adaptive_verification": True, "lookup": True}
CONFIGS = {
    "plain": None,
    "default": DEFAULT,
    "fallback": dict(DEFAULT, plain_fallback=True),  # with the plain-decoding fallback
    "profiled": dict(DEFAULT, live_step_time=False),  # the step-time table as profiled
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="plain,default", help=f"from {', '.join(CONFIGS)} (default: %(default)s)")
    ap.add_argument("--concurrency", type=int, default=16, help="(default: %(default)s)")
    ap.add_argument("--num-prompts", type=int, default=200, help="held-out prompts, mixed domains (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=2, help="(default: %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=64, help="(default: %(default)s)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    if any(n not in CONFIGS for n in names) or "plain" not in names or args.rounds < 1:
        print(f"error: --configs must name plain and others from {', '.join(CONFIGS)}; --rounds >= 1", file=sys.stderr)
        return 2

    from dspark.bench.dataset import heldout_prompts
    from dspark.engine.config import SpeculativeConfig
    from dspark.engine.engine import EngineConfig, LLMEngine
    from dspark.runtime.target import Target
    from dspark.sampling import SamplingParams

    target = Target.load("default", dtype="auto", device="cpu", max_len=2048, log=print)
    prompts = [target.tokenizer.apply_chat_template(p.chat_messages())
               for p in heldout_prompts("mixed", args.num_prompts)]
    c = args.concurrency
    results: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            spec = SpeculativeConfig(**CONFIGS[name]) if CONFIGS[name] else None
            engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=c, max_model_len=2048))
            engine.generate(prompts[:c], SamplingParams(max_tokens=8, ignore_eos=True))  # warm-up
            t0 = time.perf_counter()
            seqs = engine.generate(prompts, SamplingParams(max_tokens=args.max_tokens, ignore_eos=True))
            seconds = time.perf_counter() - t0
            tps = sum(len(s.output_ids) for s in seqs) / seconds
            results[name].append(tps)
            print(f"round {r + 1}/{args.rounds} {name}: {tps:.1f} tok/s ({seconds:.0f} s)", flush=True)
    print(f"\n{len(prompts)} prompts, concurrency {c}, {args.max_tokens} tokens, {args.rounds} rounds")
    summary = {}
    for name, v in results.items():
        ratios = [a / b for a, b in zip(v, results["plain"])]
        summary[name] = {"tok_s": v, "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                         "ratio_max": max(ratios)}
        print(f"{name:<10} {statistics.median(v):7.1f} tok/s   x plain {statistics.median(ratios):.3f} "
              f"[{min(ratios):.3f}-{max(ratios):.3f}]")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "results": summary}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
