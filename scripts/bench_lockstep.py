"""Configurations compared step by step: one engine per configuration, all in one
process, stepped in turn (one step of each, then again, in the reverse order every
other round, so that no configuration always steps right after another), so that the
machine's drift falls on every configuration alike within tens of milliseconds rather
than within the minute a served point takes.

Each engine keeps --concurrency requests in flight (a finished request is replaced
by the next prompt at once, as a client at that concurrency would), over the same
held-out prompts, greedy, `ignore_eos`. An engine's time is the sum of its own steps'
wall times; all do the same work (every prompt, --max-tokens tokens each), so the
ratio of plain decoding's time to a configuration's is its speedup. With --repeats R
the whole run is repeated R times (fresh engines each time, the order of the
configurations rotated); the ratio is reported as the median and range over repeats.

With every request --max-tokens long, plain decoding's requests finish together and
their successors' prompts are prefilled in one step, while speculation's drift apart
and are prefilled one at a time (at 4 requests on the default model, prefill took
about a quarter of the time). Served requests differ in length: --length-spread F
gives each prompt its own length, drawn once (fixed seed) from --max-tokens x
[1 - F, 1 + F], the same for every configuration.

    python3 scripts/bench_lockstep.py --concurrency 16
    python3 scripts/bench_lockstep.py --configs plain,default,default-held-plain --concurrency 4 --repeats 3
    python3 scripts/bench_lockstep.py --configs plain,lookup-priced,lookup5 --concurrency 1 \
        --config 'lookup5={"method": "ngram", "enable_adaptive_verification": true, "prompt_lookup_max": 5}'
    python3 scripts/bench_lockstep.py --model ~/.cache/dspark/models/qwen2.5-coder-0.5b-instruct-* \
        --dtype fp32 --configs plain,lookup --concurrency 1

`default-held-plain` is the default configuration with its governor held in plain mode
at every load: what speculation's machinery costs when it drafts nothing (a step that
speculates nothing should cost what a plain step costs). `plain-again` is a second
plain engine: its ratio to plain decoding is the method's own resolution in that run.

With more than two configurations the first and last step twice in a row where the
order turns. Four identical plain lanes at 4 requests put the last lane's time at 0.995
of its run's mean (0.993-0.999 over 4 repeats), the others at 1.001-1.002
(benchmarks/avx2-s52/lanes_c4.txt): give --repeats at least the number of
configurations, so that the rotation puts each one last once.

`NAME@PRECISION` (e.g. `plain@bf16x`) runs configuration NAME on the target loaded in
that precision instead of --dtype's, so that precisions are compared stepped in turn
too; its ratio is still to `plain` in --dtype's precision.

Stepping engines in turn shares the CPU caches between them (the target's weights are
shared; each engine has its own KV cache): every configuration pays that alike. This
measures the engine, not HTTP; `dspark bench sweep` measures a served point.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

from dspark.engine.config import DEFAULT_SPECULATIVE

CONFIGS = {
    "plain": None,
    "plain-again": None,  # an A/A control: a second plain engine
    "plain-b": None,  # more plain engines: the lanes' positions in the stepping order (see the docstring)
    "plain-c": None,
    "default": DEFAULT_SPECULATIVE,
    "default-held-plain": DEFAULT_SPECULATIVE,  # its governor held in plain mode (see the docstring)
    "default-plain-from4": dict(DEFAULT_SPECULATIVE, plain_fallback=4),  # levels of 4+ requests start plain
    # the default without pricing a drafting step against lookup alone (as before that pricing)
    "default-unpriced": DEFAULT_SPECULATIVE,
    # the default with its drafting steps' time outside the target lumped with lookup-only steps' (as before the split)
    "default-lumped": DEFAULT_SPECULATIVE,
    # the default with the drafter on wherever the governor leaves speculating (as before the drafter governor)
    "default-drafting": DEFAULT_SPECULATIVE,
    # the default feeding the drafter a long backlog while the drafter is off (as before letting it go then)
    "default-feeding": DEFAULT_SPECULATIVE,
    # the default with its drafter governor held at lookup alone (what the hybrid's machinery costs lookup)
    "default-lookup-alone": DEFAULT_SPECULATIVE,
    # the DSpark drafter alone, its drafter governor held off: plain steps that keep the drafter's context
    "dspark-off": dict(DEFAULT_SPECULATIVE, lookup=False, lookup_history=False),
    # the default with its drafter first below the fallback's levels (as before lookup alone first everywhere)
    "default-drafter-first": DEFAULT_SPECULATIVE,
    # the default held at lookup alone, tapping nothing for the drafter and keeping no context for it (what lookup
    # alone costs in the hybrid without the drafter's machinery)
    "default-lookup-alone-untapped": DEFAULT_SPECULATIVE,
    "default-gated": DEFAULT_SPECULATIVE,  # its lookup gate at every load (as before LOOKUP_GATE_FROM)
    # the default without lookup in earlier replies (as before lookup_history; see --warm-history)
    "default-no-history": dict(DEFAULT_SPECULATIVE, lookup_history=False),
    "hybrid": {"method": "dspark", "enable_adaptive_verification": True, "lookup": True},  # never governed
    "dspark": dict(DEFAULT_SPECULATIVE, lookup=False, lookup_history=False),
    "lookup": {"method": "ngram"},  # prompt lookup alone, fixed verification: needs no drafter (any model)
    "lookup3": {"method": "ngram", "num_speculative_tokens": 3},  # up to 3 lookup tokens, fixed verification
    "lookup-priced": {"method": "ngram", "enable_adaptive_verification": True},  # calibrated, lengths priced
    "lookup-priced-from2": {"method": "ngram", "enable_adaptive_verification": True, "plain_fallback": 2},
    # the same without the prefix cache (as speculating prompt lookup ran before it could reuse prompts kept untapped)
    "lookup-priced-from2-uncached": {"method": "ngram", "enable_adaptive_verification": True, "plain_fallback": 2},
    "lookup-governed": {"method": "ngram", "plain_fallback": True},  # the same, the governor at every load
    "lookup-governed-from2": {"method": "ngram", "plain_fallback": 2},  # governed from 2 requests, starting plain
    "lookup3-governed-from2": {"method": "ngram", "num_speculative_tokens": 3, "plain_fallback": 2},  # 3 tokens
}


class Lane:
    """One configuration's engine, keeping `concurrency` requests in flight."""

    def __init__(self, name, engine, prompts, params, concurrency):
        """`params`: each prompt's own sampling parameters."""
        self.name, self.engine, self.concurrency = name, engine, concurrency
        self.pending = list(zip(prompts, params))[::-1]
        self.seconds = 0.0
        self.target_seconds = 0.0  # in the target's forwards
        self.steps = 0
        self.tokens = 0
        self.speculated = 0  # steps that verified at least one drafted token

    def done(self) -> bool:
        return not self.pending and not self.engine.has_unfinished()

    def step(self) -> None:
        e = self.engine
        while self.pending and len(e.running) + len(e.waiting) < self.concurrency:
            e.add_request(*self.pending.pop())
        t = time.perf_counter()
        out = e.step()
        self.seconds += time.perf_counter() - t
        self.target_seconds += e.runner.last_target_seconds
        self.steps += 1
        self.tokens += sum(len(o.new_tokens) for o in out)
        self.speculated += bool(sum(e.runner.last_verify_lengths))


def warm_replies(n: int) -> list[list[int]]:
    """n of the default model's replies to training prompts (shuffled, fixed seed)."""
    import gzip
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "datasets/smollm2-135m-instruct/train.jsonl.gz"
    with gzip.open(path, "rt") as f:
        replies = [json.loads(line)["response_token_ids"] for line in f]
    random.Random(0).shuffle(replies)
    return replies[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="plain,default", help=f"from {', '.join(CONFIGS)}; plain among them "
                                                                "(default: %(default)s)")
    ap.add_argument("--concurrency", type=int, default=16, help="requests in flight per engine (default: %(default)s)")
    ap.add_argument("--num-prompts", type=int, default=64, help="held-out prompts, mixed domains (default: %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=96, help="(default: %(default)s)")
    ap.add_argument("--length-spread", type=float, default=0.0,
                    help="each prompt's length drawn from --max-tokens x [1 - F, 1 + F] (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=1, help="whole runs, fresh engines each (default: %(default)s)")
    ap.add_argument("--model", default="default", help="the target: 'default', a model directory or a GGUF file "
                                                       "(default: %(default)s)")
    ap.add_argument("--dtype", default="auto", help="the target's precision (default: %(default)s)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--warm-history", type=int, default=0, metavar="N",
                    help="feed every lane with a reply history (lookup_history) N replies of the default model "
                         "from datasets/smollm2-135m-instruct/train.jsonl.gz first, as a server that had served "
                         "them would hold (default: 0)")
    ap.add_argument("--config", action="append", default=[], metavar="NAME=JSON",
                    help="one more configuration for --configs to name: a --speculative-config JSON object "
                         "(repeatable), e.g. 'lookup5={\"method\": \"ngram\", \"prompt_lookup_max\": 5}'")
    args = ap.parse_args()
    for item in args.config:
        name, eq, text = item.partition("=")
        try:
            cfg = json.loads(text) if eq and name.strip() else None
        except json.JSONDecodeError as e:
            print(f"error: --config {name.strip()}: not valid JSON ({e})", file=sys.stderr)
            return 2
        if not isinstance(cfg, dict) or name.strip() in CONFIGS:
            print(f"error: --config takes NAME=JSON, a new name and a JSON object, got {item!r}", file=sys.stderr)
            return 2
        from dspark.engine.config import SpeculativeConfig
        from dspark.errors import UserError

        try:
            SpeculativeConfig.from_dict(cfg)
        except UserError as e:
            print(f"error: --config {name.strip()}: {e}", file=sys.stderr)
            return 2
        CONFIGS[name.strip()] = cfg
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    if any(n.split("@")[0] not in CONFIGS for n in names) or "plain" not in names or len(set(names)) != len(names):
        print(f"error: --configs must name plain and others from {', '.join(CONFIGS)} (each optionally "
              f"@PRECISION), each once", file=sys.stderr)
        return 2
    if args.concurrency < 1 or args.num_prompts < 1 or args.max_tokens < 1 or args.repeats < 1:
        print("error: --concurrency, --num-prompts, --max-tokens and --repeats must be >= 1", file=sys.stderr)
        return 2
    if args.warm_history < 0 or (args.warm_history and args.model != "default"):
        print("error: --warm-history takes a number >= 0 and holds the default model's replies", file=sys.stderr)
        return 2
    if not 0.0 <= args.length_spread < 1.0:
        print("error: --length-spread must be in [0, 1)", file=sys.stderr)
        return 2

    from dspark.bench.dataset import heldout_prompts
    from dspark.engine.config import SpeculativeConfig
    from dspark.engine.engine import EngineConfig, LLMEngine
    from dspark.runtime.target import Target
    from dspark.sampling import SamplingParams

    targets = {}
    for precision in dict.fromkeys([args.dtype] + [n.split("@")[1] for n in names if "@" in n]):
        try:
            targets[precision] = Target.load(args.model, dtype=precision, device="cpu", max_len=2048, log=print)
        except ValueError as e:  # an unknown precision, or one this CPU does not run
            print(f"error: {e}", file=sys.stderr)
            return 2
    target = targets[args.dtype]
    prompts = [target.tokenizer.apply_chat_template(p.chat_messages())
               for p in heldout_prompts("mixed", args.num_prompts)]
    rng = random.Random(0)
    lengths = [max(1, round(args.max_tokens * (1 + args.length_spread * rng.uniform(-1, 1)))) for _ in prompts]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    warm = warm_replies(args.warm_history) if args.warm_history > 0 else []
    runs = []
    for rep in range(args.repeats):
        order = names[rep % len(names):] + names[: rep % len(names)]
        lanes = []
        for lane_name in order:
            name, _, precision = lane_name.partition("@")
            spec = SpeculativeConfig(**CONFIGS[name]) if CONFIGS[name] else None
            engine = LLMEngine(targets[precision or args.dtype], spec,
                               EngineConfig(max_num_seqs=args.concurrency, max_model_len=2048))
            engine.generate(prompts[: args.concurrency], SamplingParams(max_tokens=8, ignore_eos=True))  # warm-up
            if name == "default-held-plain":
                if engine.governor is None:
                    print("error: the default configuration has no governor here (no step-time table?)",
                          file=sys.stderr)
                    return 1
                engine.governor.speculating = lambda n: False
            if name == "default-gated":
                engine.runner.lookup_gate_from = 1
            if name.endswith("-unpriced"):
                engine.runner._drafting_over_lookup = lambda decodes, rows, n, prefill_tokens: rows
            if name.endswith("-lumped") and engine.live_table is not None:
                lumped = engine.live_table.record_outside
                engine.live_table.record_outside = lambda n, spec, sec, sel, *rest: lumped(n, spec, sec, sel)
            if name == "default-feeding":
                engine.runner.feed.feeding = lambda runner=engine.runner: runner.speculating
            if name.startswith("default-lookup-alone") or name == "dspark-off":
                engine.drafter_governor.speculating = lambda n: False
            if name.endswith("-untapped"):
                engine.runner.hidden_layers, engine.runner.feed = [], None
            if name == "default-drafter-first":
                from dspark.engine.governor import SpecGovernor

                engine.drafter_governor = SpecGovernor(from_requests=2 ** engine.governor.trials_bucket,
                                                       trials_from=1)
            if name == "default-drafting":
                engine.drafter_governor = None
            if name.endswith("-uncached"):
                engine.runner.prefix = None
            for reply in warm:
                engine.runner.drafter.remember_reply(reply)
            lanes.append(Lane(lane_name, engine, prompts, params, args.concurrency))
        rnd = 0
        while not all(lane.done() for lane in lanes):
            for lane in lanes if rnd % 2 == 0 else lanes[::-1]:
                if not lane.done():
                    lane.step()
            rnd += 1
        run = {lane.name: {"seconds": lane.seconds, "target_seconds": lane.target_seconds,
                           "tok_s": lane.tokens / lane.seconds, "steps": lane.steps,
                           "speculated_steps": lane.speculated,
                           "drafting_priced_out": lane.engine.runner.priced_out} for lane in lanes}
        run["order"] = order
        plain = run["plain"]["seconds"]
        for name in names:
            run[name]["x_plain"] = plain / run[name]["seconds"]
        runs.append(run)
        print(f"repeat {rep + 1}/{args.repeats}: " + "  ".join(
            f"{n} {run[n]['tok_s']:.1f} tok/s x{run[n]['x_plain']:.3f} ({run[n]['speculated_steps']}/"
            f"{run[n]['steps']} steps speculated; {1e3 * run[n]['target_seconds'] / run[n]['steps']:.2f} ms target, "
            f"{1e3 * (run[n]['seconds'] - run[n]['target_seconds']) / run[n]['steps']:.2f} ms outside a step)"
            for n in names), flush=True)
        for lane in lanes:
            if lane.engine.governor is not None and lane.name.partition("@")[0] != "default-held-plain":
                print(f"  {lane.name} governor " + json.dumps(lane.engine.governor.summary()), flush=True)
            if lane.engine.drafter_governor is not None:
                print(f"  {lane.name} drafter governor " + json.dumps(lane.engine.drafter_governor.summary()),
                      flush=True)
    spread = f" (x [{1 - args.length_spread:g}, {1 + args.length_spread:g}])" if args.length_spread else ""
    print(f"\n{args.num_prompts} prompts, concurrency {args.concurrency}, {args.max_tokens} tokens{spread}, "
          f"{args.repeats} repeats, engines stepped in turn")
    summary = {}
    for name in names:
        x = [r[name]["x_plain"] for r in runs]
        summary[name] = {"x_plain_median": statistics.median(x), "x_plain_min": min(x), "x_plain_max": max(x),
                         "tok_s": [r[name]["tok_s"] for r in runs]}
        print(f"{name:<20} x plain {statistics.median(x):.3f} [{min(x):.3f}-{max(x):.3f}]   "
              f"tok/s {statistics.median(summary[name]['tok_s']):.1f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "summary": summary, "runs": runs}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
