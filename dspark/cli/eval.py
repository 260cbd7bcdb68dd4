"""`dspark eval`: offline measurements of drafters."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .common import add_model_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="offline drafter measurements (acceptance length per domain)")
    p.set_defaults(func=lambda _: p.print_help())
    esub = p.add_subparsers(dest="eval_command", metavar="{acceptance}")
    a = esub.add_parser(
        "acceptance",
        help="acceptance length and per-position acceptance on held-out math/code/chat prompts",
        description="Decode held-out prompts through the speculative engine with each drafter at a fixed "
                    "verification length and report the engine's own counters: mean acceptance length "
                    "tau (accepted drafts + 1 bonus per round) and per-position conditional acceptance. "
                    "Greedy by default. Writes one PNG of acceptance by position for all drafters.",
    )
    a.add_argument("--drafter", action="append", required=True, metavar="DIR",
                   help="drafter checkpoint directory (repeatable); 'ngram' = model-free prompt lookup "
                        "(n = 1..3), the baseline a trained drafter has to beat; DIR+lookup = hybrid drafting, "
                        "prompt lookup and the dspark drafter DIR in one block")
    a.add_argument("--block", default="7",
                   help="drafted tokens per round, comma-separated for several, e.g. 7,15 (default: %(default)s); "
                        "a drafter that drafts fewer (MTP-1) runs at its maximum")
    a.add_argument("--drafter-weights", default="bf16", metavar="W[,W]",
                   help="how each learned drafter's linears are stored, comma-separated to compare: bf16 (the "
                        "target's bf16 kernel), q8_0 or q4_0 (quantized at load, int8 activations) "
                        "(default: %(default)s)")
    a.add_argument("--domains", default="math,code,chat", help="held-out domains (default: %(default)s)")
    a.add_argument("--num-prompts", type=int, default=10, help="prompts per domain (default: %(default)s)")
    a.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt (default: %(default)s)")
    a.add_argument("--max-prompt-tokens", type=int, default=768,
                   help="skip longer prompts (default: %(default)s)")
    a.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    a.add_argument("--max-num-seqs", type=int, default=8, help="requests decoded together (default: %(default)s)")
    a.add_argument("--plot", default="acceptance.png", metavar="PNG", help="(default: %(default)s)")
    a.add_argument("--json", action="store_true", help="print one JSON object per result line")
    add_model_args(a)
    a.set_defaults(func=run_acceptance)


def run_acceptance(args: argparse.Namespace) -> int:
    from dspark.data import DOMAINS, DataError
    from dspark.errors import UserError
    from dspark.eval.acceptance import acceptance_plot, drafter_method, format_table, heldout_prompt_ids, measure_acceptance

    from .common import load_target

    try:
        blocks = sorted({int(b) for b in args.block.split(",") if b.strip()})
    except ValueError:
        raise UserError(f"--block must be comma-separated integers, got {args.block!r}") from None
    if not blocks or min(blocks) < 1:
        raise UserError("--block must be >= 1")
    domains = [d.strip() for d in args.domains.split(",") if d.strip()]
    bad = [d for d in domains if d not in DOMAINS]
    if bad or not domains:
        raise UserError(f"--domains must be a comma-separated subset of {', '.join(DOMAINS)}, got {args.domains!r}")
    if args.num_prompts < 1 or args.max_tokens < 1:
        raise UserError("--num-prompts and --max-tokens must be >= 1")
    from dspark.engine.config import DRAFTER_WEIGHTS

    weights = [w.strip() for w in args.drafter_weights.split(",") if w.strip()]
    if not weights or any(w not in DRAFTER_WEIGHTS for w in weights):
        raise UserError(f"--drafter-weights must be a comma-separated subset of {', '.join(DRAFTER_WEIGHTS)}, "
                        f"got {args.drafter_weights!r}")
    for d in args.drafter:
        drafter_method(d)  # a clear error before any decoding
    target = load_target(args)
    try:
        prompts = heldout_prompt_ids(target.tokenizer, domains, args.num_prompts, args.max_prompt_tokens)
    except DataError as e:
        raise UserError(str(e)) from None
    results = []
    runs = [(path, w) for path in args.drafter for w in (weights if drafter_method(path)[0] != "ngram" else ["bf16"])]
    for path, w in runs:
        done_blocks = set()
        for block in blocks:
            _, most = drafter_method(path)
            if min(block, most) in done_blocks:
                continue  # e.g. MTP-1 at block 15 is MTP-1 at block 7
            done_blocks.add(min(block, most))
            for d in domains:
                r = measure_acceptance(target, path, block, prompts[d], args.max_tokens, args.temperature,
                                       args.max_num_seqs, args.max_model_len, domain=d, drafter_weights=w)
                results.append(r)
                if args.json:
                    print(json.dumps(r.to_dict()))
                else:
                    pos = " ".join(f"{x:.2f}" for x in r.conditional)
                    print(f"{r.drafter:<12} {r.method:<7} block {r.block:>2} {d:<5} tau {r.acceptance_length:.3f} "
                          f"({r.rounds} rounds, {r.output_tokens} tokens, {r.wall_s:.0f} s)  "
                          f"conditional acceptance by position: {pos}", file=sys.stderr)
    plot = acceptance_plot(Path(args.plot), results)
    if not args.json:
        print(format_table(results))
        print(f"plot: {plot}", file=sys.stderr)
    return 0
