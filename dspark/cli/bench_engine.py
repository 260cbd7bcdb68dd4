"""`dspark bench engine`: configurations stepped in turn in one process, without HTTP
(`dspark.eval.lockstep`). Where `dspark bench sweep` measures served points, this
measures the engine alone; every row of its JSON carries the commit and the machine."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path


def register(bsub: argparse._SubParsersAction) -> None:
    e = bsub.add_parser(
        "engine", help="the engines of several configurations stepped in turn, in one process (no HTTP)",
        description="One engine per configuration over the same held-out prompts, greedy, each keeping "
                    "--concurrency requests in flight, stepped in turn (the order reversed every other round) "
                    "so that the machine's drift falls on all alike; each configuration's time against plain "
                    "decoding's, its rounds, and the target's share of its steps. --repeats rotates the order "
                    "(give at least the number of configurations). NAME@PRECISION runs NAME on the target in "
                    "that precision; NAME+uncached without the prefix cache.",
    )
    from dspark.presets import PRESETS

    e.add_argument("--configs", default="plain,default",
                   help=f"comma-separated; plain among them; from {', '.join(PRESETS)}, plain-again (an A/A "
                        "control) and the others `dspark.eval.lockstep.ENGINE_CONFIGS` lists "
                        "(default: %(default)s)")
    e.add_argument("--config", action="append", default=[], metavar="NAME=JSON",
                   help="one more configuration for --configs to name: a --speculative-config JSON object "
                        "(repeatable)")
    e.add_argument("--concurrency", type=int, default=16, help="requests in flight per engine (default: %(default)s)")
    e.add_argument("--num-prompts", type=int, default=64, help="held-out prompts, mixed domains (default: %(default)s)")
    e.add_argument("--max-tokens", type=int, default=96, help="(default: %(default)s)")
    e.add_argument("--length-spread", type=float, default=0.0, metavar="F",
                   help="each prompt's length drawn from --max-tokens x [1 - F, 1 + F] (default: %(default)s)")
    e.add_argument("--repeats", type=int, default=1, help="whole runs, fresh engines each (default: %(default)s)")
    e.add_argument("--warm-history", type=int, default=0, metavar="N",
                   help="hold N of the default model's replies (datasets/smollm2-135m-instruct/train.jsonl.gz) in "
                        "every drafter's reply history first, as a server that had served them would "
                        "(default: 0)")
    e.add_argument("--model", default="default", help="the target (default: %(default)s)")
    e.add_argument("--dtype", default="auto", help="the target's precision (default: %(default)s)")
    e.add_argument("--json-out", default=None, metavar="FILE", help="also write the results record here")
    e.set_defaults(func=run_engine)


def _parse_configs(args: argparse.Namespace):
    from dspark.engine.config import SpeculativeConfig
    from dspark.errors import UserError
    from dspark.eval.lockstep import ENGINE_CONFIGS, LaneSpec

    configs = dict(ENGINE_CONFIGS)
    for item in args.config:
        name, eq, text = item.partition("=")
        name = name.strip()
        try:
            cfg = json.loads(text) if eq and name else None
        except json.JSONDecodeError as e:
            raise UserError(f"--config {name}: not valid JSON ({e})") from None
        if not isinstance(cfg, dict) or name in configs:
            raise UserError(f"--config takes NAME=JSON, a new name and a JSON object, got {item!r}")
        SpeculativeConfig.from_dict(cfg)  # a bad field says so now, before any model loads
        configs[name] = cfg
    labels = [c.strip() for c in args.configs.split(",") if c.strip()]
    if "plain" not in labels or len(set(labels)) != len(labels):
        raise UserError("--configs must name plain and each configuration once")
    try:
        return [LaneSpec.parse(label, configs) for label in labels]
    except ValueError as e:
        raise UserError(str(e)) from None


def _warm_replies(n: int) -> list[list[int]]:
    """n of the default model's replies to training prompts (shuffled, fixed seed)."""
    import gzip
    import random

    path = Path(__file__).resolve().parents[2] / "datasets/smollm2-135m-instruct/train.jsonl.gz"
    with gzip.open(path, "rt") as f:
        replies = [json.loads(line)["response_token_ids"] for line in f]
    random.Random(0).shuffle(replies)
    return replies[:n]


def run_engine(args: argparse.Namespace) -> int:
    from dspark.errors import UserError

    if min(args.concurrency, args.num_prompts, args.max_tokens, args.repeats) < 1:
        raise UserError("--concurrency, --num-prompts, --max-tokens and --repeats must be >= 1")
    if not 0.0 <= args.length_spread < 1.0:
        raise UserError("--length-spread must be in [0, 1)")
    if args.warm_history < 0 or (args.warm_history and args.model != "default"):
        raise UserError("--warm-history takes a number >= 0 and holds the default model's replies")
    lanes = _parse_configs(args)

    from dspark.bench.dataset import heldout_prompts
    from dspark.bench.provenance import git_commit, provenance
    from dspark.eval.lockstep import LockstepRun, prompt_lengths, run_lockstep, summarize
    from dspark.runtime.machine import machine_id
    from dspark.runtime.target import Target

    targets = {}
    for precision in dict.fromkeys([None] + [lane.precision for lane in lanes if lane.precision]):
        try:
            targets[precision] = Target.load(args.model, dtype=precision or args.dtype, device="cpu", max_len=2048,
                                             log=print)
        except ValueError as e:  # an unknown precision, or one this CPU does not run
            raise UserError(str(e)) from None
    target = targets[None]
    prompts = [target.tokenizer.apply_chat_template(p.chat_messages())
               for p in heldout_prompts("mixed", args.num_prompts)]
    run = LockstepRun(lanes, prompts, prompt_lengths(len(prompts), args.max_tokens, args.length_spread),
                      args.concurrency, args.repeats, _warm_replies(args.warm_history) if args.warm_history else [])
    runs = run_lockstep(run, targets, say=lambda line: print(line, flush=True))
    names = [lane.label for lane in lanes]
    summary = summarize(runs, names)
    spread = f" (x [{1 - args.length_spread:g}, {1 + args.length_spread:g}])" if args.length_spread else ""
    print(f"\n{len(prompts)} prompts, concurrency {args.concurrency}, {args.max_tokens} tokens{spread}, "
          f"{args.repeats} repeats, engines stepped in turn; {machine_id()}, commit {git_commit() or '?'}")
    for name in names:
        s = summary[name]
        print(f"{name:<24} x plain {s['x_plain_median']:.3f} [{s['x_plain_min']:.3f}-{s['x_plain_max']:.3f}]   "
              f"tok/s {s['tok_s_median']:.1f}")
    if args.json_out:
        record = {**provenance(shlex.join(["dspark", *args.cli_argv])), "machine": machine_id(),
                  "args": {k: v for k, v in vars(args).items() if k not in ("func", "cli_argv")},
                  "summary": summary, "runs": runs}
        Path(args.json_out).write_text(json.dumps(record, indent=1))
    return 0
