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

With --phases, each configuration's steps of its last round are also split: steps with
a prompt chunk ("mixed") and pure decode steps, and for the latter the mean ms per
step in the target's forward, the drafter's call, selection (lookup, the policy,
merging drafts) and everything else, the draft tokens verified and the tokens emitted
per step, and the share of steps that drafted. And, over all rounds, each
configuration's efficiency per load level (requests decoding in a step: 1-7, 8-15,
16-31, 32+): its pure decode steps' tokens, each worth what plain decoding took per
token at that request count (the median of plain's own steps there), over the time
the steps took; 1 is plain decoding's speed, above 1 speculation paid at that load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

from dspark.engine.config import DEFAULT_SPECULATIVE

HYBRID = {"method": "dspark", "enable_adaptive_verification": True, "lookup": True}
CONFIGS = {
    "plain": None,
    # the default configuration: hybrid, with its plain-decoding fallback at high load
    "default": DEFAULT_SPECULATIVE,
    "hybrid": HYBRID,  # without the fallback
    "fallback": dict(HYBRID, plain_fallback=True),  # the fallback at every load
    "profiled": dict(DEFAULT_SPECULATIVE, live_step_time=False),  # the step-time table as profiled
    # the default with the governor's earlier early exit: a speculation trial at a level
    # that starts plain ran its triple length unless it fell below EARLY_EXIT (0.85)
    "default-exit085": DEFAULT_SPECULATIVE,
}
#: LoadLevel class settings a configuration runs with (restored after its run)
GOVERNOR = {"default-exit085": {"EARLY_EXIT_PLAIN_START": 0.85}}


@contextlib.contextmanager
def governor_settings(name: str):
    from dspark.engine.governor import LoadLevel
    saved = {k: getattr(LoadLevel, k) for k in GOVERNOR.get(name, {})}
    for k, v in GOVERNOR.get(name, {}).items():
        setattr(LoadLevel, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(LoadLevel, k, v)


def watch_steps(engine) -> list[dict]:
    """Record every step of `engine` from now on: its phases as the runner timed them."""
    steps: list[dict] = []
    inner, runner = engine.step, engine.runner

    def step():
        t = time.perf_counter()
        out = inner()
        seconds = time.perf_counter() - t
        lengths = runner.last_verify_lengths
        mixed = runner.last_forward_tokens != len(lengths) + sum(lengths)  # a prompt chunk rode along
        if out:
            steps.append({"s": seconds, "target": runner.last_target_seconds, "draft": runner.last_draft_seconds,
                          "select": runner.last_select_seconds, "mixed": mixed,
                          "verified": sum(lengths), "drafted": runner.last_drafted_requests,
                          "emitted": sum(len(o.new_tokens) for o in out), "rows": len(out),
                          "tokens": runner.last_forward_tokens, "spec": runner.speculating})
        return out

    engine.step = step
    return steps


def phase_summary(steps: list[dict]) -> dict:
    dec = [s for s in steps if not s["mixed"]]
    if not dec:
        return {"steps": len(steps), "decode_steps": 0}
    n = len(dec)

    def ms(key):
        return round(1e3 * sum(s[key] for s in dec) / n, 2)

    other = 1e3 * sum(s["s"] - s["target"] - s["draft"] - s["select"] for s in dec) / n
    return {"steps": len(steps), "mixed_steps": len(steps) - n, "mixed_ms": round(
            1e3 * sum(s["s"] for s in steps if s["mixed"]) / max(len(steps) - n, 1), 2),
            "decode_steps": n, "ms": ms("s"), "target_ms": ms("target"), "draft_ms": ms("draft"),
            "select_ms": ms("select"), "other_ms": round(other, 2),
            "rows": round(sum(s["rows"] for s in dec) / n, 1),
            "verified": round(sum(s["verified"] for s in dec) / n, 2),
            "emitted": round(sum(s["emitted"] for s in dec) / n, 2),
            "drafting_share": round(sum(1 for s in dec if s["drafted"]) / n, 3)}


LEVELS = ((1, 7), (8, 15), (16, 31), (32, 10**9))


def level_efficiency(steps: list[dict], plain_steps: list[dict]) -> dict:
    """Efficiency per load level against plain decoding's own steps (module docstring)."""
    by_rows: dict[int, list[float]] = {}
    for s in plain_steps:
        if not s["mixed"] and s["rows"]:
            by_rows.setdefault(s["rows"], []).append(s["s"])
    if not by_rows:
        return {}
    per_token = {r: statistics.median(v) / r for r, v in by_rows.items()}

    def plain_per_token(rows: int) -> float:
        return per_token[min(per_token, key=lambda r: (abs(r - rows), r))]

    out = {}
    for lo, hi in LEVELS:
        dec = [s for s in steps if not s["mixed"] and lo <= s["rows"] <= hi]
        if dec:
            worth = sum(s["emitted"] * plain_per_token(s["rows"]) for s in dec)
            out[f"{lo}-{hi}" if hi < 10**9 else f"{lo}+"] = {
                "steps": len(dec), "speculated": sum(1 for s in dec if s["verified"]),
                "efficiency": round(worth / sum(s["s"] for s in dec), 3)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="plain,default", help=f"from {', '.join(CONFIGS)} (default: %(default)s)")
    ap.add_argument("--concurrency", type=int, default=16, help="(default: %(default)s)")
    ap.add_argument("--num-prompts", type=int, default=200, help="held-out prompts, mixed domains (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=2, help="(default: %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=64, help="(default: %(default)s)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--phases", action="store_true", help="also split the last round's steps by phase")
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
    phases: dict[str, dict] = {}
    all_steps: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            spec = SpeculativeConfig(**CONFIGS[name]) if CONFIGS[name] else None
            engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=c, max_model_len=2048))
            engine.generate(prompts[:c], SamplingParams(max_tokens=8, ignore_eos=True))  # warm-up
            steps = watch_steps(engine) if args.phases else None
            with governor_settings(name):
                t0 = time.perf_counter()
                seqs = engine.generate(prompts, SamplingParams(max_tokens=args.max_tokens, ignore_eos=True))
                seconds = time.perf_counter() - t0
            tps = sum(len(s.output_ids) for s in seqs) / seconds
            results[name].append(tps)
            print(f"round {r + 1}/{args.rounds} {name}: {tps:.1f} tok/s ({seconds:.0f} s)", flush=True)
            if engine.governor is not None and args.phases:  # each level's mode, scores, steps, switches
                print("  governor " + json.dumps(engine.governor.summary()), flush=True)
            if steps is not None:
                all_steps[name].extend(steps)
                if r == args.rounds - 1:
                    phases[name] = phase_summary(steps)
                    print("  " + json.dumps(phases[name]), flush=True)
    print(f"\n{len(prompts)} prompts, concurrency {c}, {args.max_tokens} tokens, {args.rounds} rounds")
    summary = {}
    for name, v in results.items():
        ratios = [a / b for a, b in zip(v, results["plain"])]
        summary[name] = {"tok_s": v, "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                         "ratio_max": max(ratios)}
        print(f"{name:<10} {statistics.median(v):7.1f} tok/s   x plain {statistics.median(ratios):.3f} "
              f"[{min(ratios):.3f}-{max(ratios):.3f}]")
    if args.phases:
        print("\nefficiency per load level (requests decoding), x plain decoding's own steps:")
        for name in names:
            eff = level_efficiency(all_steps[name], all_steps["plain"])
            for level, e in eff.items():
                phases.setdefault(name, {}).setdefault("levels", {})[level] = e
            print(f"{name:<10} " + "  ".join(f"{lv}: {e['efficiency']:.3f} ({e['speculated']}/{e['steps']} spec)"
                                             for lv, e in eff.items()))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "results": summary, "phases": phases}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
