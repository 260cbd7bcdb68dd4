"""Where a speculative round's time goes, at one request or a batch, without HTTP.

For each configuration (plain decoding and speculative ones), prompts are decoded
greedily, one at a time or `--concurrency` at once (one batch of that many prompts,
all started together), the configurations interleaved batch by batch (so drift of
the machine falls on all of them alike), and every engine step is split into
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
    python3 scripts/bench_round_phases.py --configs plain,hybrid --concurrency 16 --prompts 2
    python3 scripts/bench_round_phases.py --configs lag2,sync,lag1,lag4 --workload switch --max-tokens 192

"vs FIRST" is each configuration's tok/s over the first configuration's on the same
batch (paired, so drift falls out): the median ratio and its range over the batches.

At --concurrency N, "tok/s" is the batch's output tokens per second, "tau" tokens per
request-round, and the phases are per step (one step serves all N requests).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict

from dspark.engine.config import DEFAULT_SPECULATIVE

CONFIGS = {
    "plain": None,
    "dspark-1": {"method": "dspark", "num_speculative_tokens": 1},
    "dspark-3": {"method": "dspark", "num_speculative_tokens": 3},
    "dspark-adaptive": {"method": "dspark", "enable_adaptive_verification": True},
    "mtp": {"method": "mtp"},
    "ngram": {"method": "ngram", "num_speculative_tokens": 3},
    "hybrid": {"method": "dspark", "enable_adaptive_verification": True, "lookup": True},
    # prompt lookup with calibrated confidences, each request's length priced on the step time
    "lookup-priced": {"method": "ngram", "enable_adaptive_verification": True},
    # the default: hybrid with its plain-decoding fallback at high load
    "default": DEFAULT_SPECULATIVE,
    # the default without prompt lookup: the drafter alone, scheduled and governed as in the default
    "default-no-lookup": {**DEFAULT_SPECULATIVE, "lookup": False, "lookup_history": False},
    # the default with the drafter's confidences as the confidence head gives them (no
    # per-request trust, as before it existed)
    "default-raw-conf": {**DEFAULT_SPECULATIVE, "drafter_trust": False},
    # the default with the scheduler's table as profiled at start-up (not corrected by measured steps)
    "hybrid-profiled": {"method": "dspark", "enable_adaptive_verification": True, "lookup": True,
                        "live_step_time": False},
    # the default with the plain-decoding fallback (off by default)
    "hybrid-fallback": {"method": "dspark", "enable_adaptive_verification": True, "lookup": True,
                        "plain_fallback": True},
    # the lag study: the default at other lags of the scheduler's survivals (lag 0 = dspark-sync,
    # the current step's own survivals, admitted up to the first drop)
    "sync": {"method": "dspark", "lookup": True, "verification_policy": "dspark-sync"},
    "lag1": {"method": "dspark", "enable_adaptive_verification": True, "lookup": True, "async_lag": 1},
    "lag2": {"method": "dspark", "enable_adaptive_verification": True, "lookup": True, "async_lag": 2},
    "lag4": {"method": "dspark", "enable_adaptive_verification": True, "lookup": True, "async_lag": 4},
    # the drafter's block and context through torch instead of the native decoder kernel
    "dspark-3-torch": {"method": "dspark", "num_speculative_tokens": 3, "torch_drafter": True},
    "hybrid-torch": {"method": "dspark", "enable_adaptive_verification": True, "lookup": True,
                     "torch_drafter": True},
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


#: requests that change character mid-stream: code first, then prose (the lag study)
SWITCH_PROMPTS = [
    "Write a Python function that checks whether a number is prime. After the code, explain in plain "
    "prose, without any code, why checking divisors up to the square root is enough.",
    "Write a JavaScript function that reverses the words of a sentence. Then, in a few paragraphs of "
    "prose, describe a day at the beach.",
    "Give a SQL query that counts orders per customer. Then write a short story about a lighthouse keeper.",
    "Write a Python class for a stack with push and pop. Then explain in prose why stacks matter in "
    "everyday life, with no code.",
    "Write a bash loop that renames every .txt file to .md. Afterwards, write a poem about autumn.",
    "Write a C function that sums an array. Then describe, in plain prose, how a bill becomes a law.",
]

PHASES = ("target", "draft", "lookup", "context", "verify", "other")


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


def run_one(target, spec, prompts: list[list[int]], max_tokens: int) -> dict:
    from dspark.engine.engine import EngineConfig, LLMEngine
    from dspark.sampling import SamplingParams

    spec, torch_drafter = spec if isinstance(spec, tuple) else (spec, False)
    engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=len(prompts), max_model_len=2048))
    clock = PhaseClock()
    runner = engine.runner
    if torch_drafter:
        inner = getattr(runner.drafter, "inner", runner.drafter)
        inner._stack = lambda: None
    clock.wrap(runner, "model", "target")
    clock.wrap(runner, "_verify", "verify")
    if runner.drafter is not None:
        clock.wrap(runner.drafter, "draft", "draft")
        clock.wrap(runner.drafter, "append_context", "context")
        if hasattr(runner.drafter, "lookup_lists"):  # lookup_only goes through it too
            clock.wrap(runner.drafter, "lookup_lists", "lookup")
    seqs = [engine.add_request(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True)) for p in prompts]
    while any(not s.prefilled for s in seqs):  # the prefills are not rounds
        engine.step()
    clock.ms.clear()
    rounds, request_rounds, t0 = 0, 0, time.perf_counter()
    start_tokens = sum(len(s.output_ids) for s in seqs)
    while not all(s.is_finished for s in seqs):
        request_rounds += sum(not s.is_finished for s in seqs)
        engine.step()
        rounds += 1
    total = (time.perf_counter() - t0) * 1e3
    tokens = sum(len(s.output_ids) for s in seqs) - start_tokens
    phases = dict(clock.ms)
    phases["other"] = total - sum(phases.values())
    return {"rounds": rounds, "request_rounds": request_rounds, "tokens": tokens, "ms": total, "phases": phases}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="plain,dspark-1,mtp,ngram",
                    help=f"comma-separated, from {', '.join(CONFIGS)} (default: %(default)s)")
    ap.add_argument("--prompts", type=int, default=6, help="prompts per configuration (default: %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=128, help="(default: %(default)s)")
    ap.add_argument("--concurrency", type=int, default=1,
                    help="requests decoded together in one batch (default: %(default)s)")
    ap.add_argument("--dtype", default="auto", help="(default: %(default)s)")
    ap.add_argument("--workload", choices=("mixed", "switch"), default="mixed",
                    help="mixed: chat, code and math prompts; switch: requests that write code, then "
                         "prose (the lag study) (default: %(default)s)")
    ap.add_argument("--json", default=None, help="also write the raw results here")
    args = ap.parse_args()
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown or args.prompts < 1 or args.concurrency < 1:
        print(f"error: unknown configs {unknown}, or --prompts / --concurrency below 1", file=sys.stderr)
        return 2

    from dspark.engine.config import SpeculativeConfig
    from dspark.runtime.target import Target

    target = Target.load("default", dtype=args.dtype, device="cpu", max_len=2048, log=print)
    specs = {}
    for n in names:
        kw = dict(CONFIGS[n] or {})
        torch_drafter = kw.pop("torch_drafter", False)
        specs[n] = (SpeculativeConfig(**kw) if kw else None, torch_drafter)
    c = args.concurrency
    pool = SWITCH_PROMPTS if args.workload == "switch" else PROMPTS
    texts = [pool[j % len(pool)] for j in range(args.prompts * c)]
    encoded = [target.tokenizer.chat_prompt(p) for p in texts]
    batches = [encoded[i * c: (i + 1) * c] for i in range(args.prompts)]  # one batch per "prompt"
    for n in names:  # warm-up: kernels, caches, first-use allocations
        run_one(target, specs[n], batches[0], 8)
    results: dict[str, list[dict]] = {n: [] for n in names}
    for i, p in enumerate(batches):
        order = names[i % len(names):] + names[: i % len(names)]  # rotate who goes first
        for n in order:
            results[n].append(run_one(target, specs[n], p, args.max_tokens))
    plain_target = None
    if "plain" in results:
        plain_target = sum(r["phases"]["target"] for r in results["plain"]) / sum(r["rounds"] for r in results["plain"])
    first = names[0]
    print(f"\n{'config':<16} {'tok/s':>7} {'vs ' + first:>22} {'tau':>5} {'ms/round':>9}  "
          + " ".join(f"{p:>8}" for p in PHASES)
          + "  outside-target")
    for n in names:
        rs = results[n]
        rounds = sum(r["rounds"] for r in rs)
        tps = statistics.median(r["tokens"] / r["ms"] * 1e3 for r in rs)
        per = {p: sum(r["phases"].get(p, 0.0) for r in rs) / rounds for p in PHASES}
        outside = sum(v for k, v in per.items() if k != "target")
        share = f"{outside / plain_target:6.1%} of plain target" if plain_target else ""
        tau = sum(r["tokens"] for r in rs) / sum(r["request_rounds"] for r in rs)
        # paired: each batch against the first configuration's run of the same batch
        ratios = [(r["tokens"] / r["ms"]) / (b["tokens"] / b["ms"]) for r, b in zip(rs, results[first])]
        paired = f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"
        print(f"{n:<16} {tps:7.1f} {paired:>22} {tau:5.2f} {sum(per.values()):9.2f}  "
              + " ".join(f"{per[p]:8.2f}" for p in per) + f"  {outside:5.2f} ms {share}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "results": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
