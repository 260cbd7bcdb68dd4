"""Where a speculative round's time goes, at one request, without HTTP.

For each configuration (plain decoding and speculative ones), prompts are decoded
greedily one at a time, the configurations interleaved prompt by prompt (so drift
of the machine falls on all of them alike), and every engine step is split into
phases:

  target    the target's forward (the verification of 1 + L tokens)
  draft     the drafter's block (`draft`)
  context   feeding the drafter the accepted tokens' hidden states (`append_context`)
  verify    rejection sampling
  other     everything else in the step: scheduling, batch preparation, bookkeeping

Prints per configuration: tokens/s, acceptance length, ms per round by phase, and the
time outside the target's forward as a share of a plain decode step's target time.

    python3 scripts/bench_round_phases.py --max-tokens 128 --prompts 6
    python3 scripts/bench_round_phases.py --configs plain,dspark-1,mtp,ngram --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict

CONFIGS = {
    "plain": None,
    "dspark-1": {"method": "dspark", "num_speculative_tokens": 1},
    "dspark-3": {"method": "dspark", "num_speculative_tokens": 3},
    "dspark-adaptive": {"method": "dspark", "enable_adaptive_verification": True},
    "mtp": {"method": "mtp"},
    "ngram": {"method": "ngram", "num_speculative_tokens": 3},
}
PROMPTS = [
    "Explain in a few sentences why the ocean is salty.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "A shop sells pens at 3 dollars each. How much do 14 pens cost? Explain.",
    "List five tips for a good night's sleep.",
    "Write a short story about a robot who learns to paint.",
    "What is the difference between a list and a tuple in Python?",
    "Sarah has 12 apples and gives away a third of them. How many are left?",
    "Describe how a bill becomes a law in the United States.",
]


class PhaseClock:
    """Wraps callables so that the time spent inside them is added to a phase."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = defaultdict(float)

    def wrap(self, obj, name: str, phase: str) -> None:
        fn = getattr(obj, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ms[phase] += (time.perf_counter() - t0) * 1e3

        setattr(obj, name, timed)


def run_one(target, spec, prompt_ids, max_tokens: int) -> dict:
    from dspark.engine.engine import EngineConfig, LLMEngine
    from dspark.sampling import SamplingParams

    engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=1, max_model_len=2048))
    clock = PhaseClock()
    runner = engine.runner
    clock.wrap(runner, "model", "target")
    clock.wrap(runner, "_verify", "verify")
    if runner.drafter is not None:
        clock.wrap(runner.drafter, "draft", "draft")
        clock.wrap(runner.drafter, "append_context", "context")
    seq = engine.add_request(prompt_ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    while seq.num_prefilled < len(prompt_ids) or not seq.prefilled:  # the prefill is not a round
        engine.step()
    clock.ms.clear()
    rounds, t0 = 0, time.perf_counter()
    start_tokens = len(seq.output_ids)
    while not seq.is_finished:
        engine.step()
        rounds += 1
    total = (time.perf_counter() - t0) * 1e3
    tokens = len(seq.output_ids) - start_tokens
    phases = dict(clock.ms)
    phases["other"] = total - sum(phases.values())
    return {"rounds": rounds, "tokens": tokens, "ms": total, "phases": phases}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="plain,dspark-1,mtp,ngram",
                    help=f"comma-separated, from {', '.join(CONFIGS)} (default: %(default)s)")
    ap.add_argument("--prompts", type=int, default=6, help="prompts per configuration (default: %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=128, help="(default: %(default)s)")
    ap.add_argument("--dtype", default="auto", help="(default: %(default)s)")
    ap.add_argument("--json", default=None, help="also write the raw results here")
    args = ap.parse_args()
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown or not 1 <= args.prompts <= len(PROMPTS):
        print(f"error: unknown configs {unknown} or --prompts outside 1..{len(PROMPTS)}", file=sys.stderr)
        return 2

    from dspark.engine.config import SpeculativeConfig
    from dspark.runtime.target import Target

    target = Target.load("default", dtype=args.dtype, device="cpu", max_len=2048, log=print)
    specs = {n: SpeculativeConfig(**CONFIGS[n]) if CONFIGS[n] else None
             for n in names}
    prompts = [target.tokenizer.chat_prompt(p) for p in PROMPTS[: args.prompts]]
    for n in names:  # warm-up: kernels, caches, first-use allocations
        run_one(target, specs[n], prompts[0], 8)
    results: dict[str, list[dict]] = {n: [] for n in names}
    for i, p in enumerate(prompts):
        order = names[i % len(names):] + names[: i % len(names)]  # rotate who goes first
        for n in order:
            results[n].append(run_one(target, specs[n], p, args.max_tokens))
    plain_target = None
    if "plain" in results:
        plain_target = sum(r["phases"]["target"] for r in results["plain"]) / sum(r["rounds"] for r in results["plain"])
    print(f"\n{'config':<16} {'tok/s':>7} {'tau':>5} {'ms/round':>9}  "
          + " ".join(f"{p:>8}" for p in ("target", "draft", "context", "verify", "other"))
          + "  outside-target")
    for n in names:
        rs = results[n]
        rounds = sum(r["rounds"] for r in rs)
        tps = statistics.median(r["tokens"] / r["ms"] * 1e3 for r in rs)
        per = {p: sum(r["phases"].get(p, 0.0) for r in rs) / rounds
               for p in ("target", "draft", "context", "verify", "other")}
        outside = sum(v for k, v in per.items() if k != "target")
        share = f"{outside / plain_target:6.1%} of T(1)" if plain_target else ""
        print(f"{n:<16} {tps:7.1f} {sum(r['tokens'] for r in rs) / rounds:5.2f} {sum(per.values()):9.2f}  "
              + " ".join(f"{per[p]:8.2f}" for p in per) + f"  {outside:5.2f} ms {share}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "results": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
