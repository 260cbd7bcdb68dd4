"""`dspark generate`: one prompt through the chat template, streamed to the terminal."""

from __future__ import annotations

import argparse
import json
import sys

from .common import add_model_args, add_speculative_arg, load_target


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="generate a reply to one prompt (plain or speculative decoding)",
        description="Apply the model's chat template to PROMPT, stream the reply to the terminal "
                    "and print decoding speed. Greedy by default (--temperature 0).",
    )
    p.add_argument("prompt", help="the user message")
    add_model_args(p)
    s = p.add_argument_group("sampling")
    s.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    s.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1] (default: %(default)s)")
    s.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens; 0 = off (default: %(default)s)")
    s.add_argument("--max-tokens", type=int, default=256, help="maximum new tokens (default: %(default)s)")
    s.add_argument("--seed", type=int, default=0, help="sampling seed; same seed, same output (default: %(default)s)")
    s.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    add_speculative_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dspark.generate import check_prompt, generate_plain
    from dspark.runtime.tokenizer import IncrementalDetokenizer
    from dspark.sampling import SamplingParams
    from dspark.engine.config import parse_speculative_arg, resolve_speculative

    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, seed=args.seed, stop=args.stop)
    spec = parse_speculative_arg(args.speculative_config)
    target = load_target(args)
    spec = resolve_speculative(spec, target)
    prompt_ids = target.tokenizer.chat_prompt(args.prompt)
    check_prompt(target, prompt_ids, args.max_model_len)

    detok = IncrementalDetokenizer(target.tokenizer, args.stop)

    def stream(ids: list[int]) -> None:
        if not args.json:
            sys.stdout.write(detok.push(ids))
            sys.stdout.flush()

    if spec is None:
        result = generate_plain(target, prompt_ids, params, on_tokens=stream, max_len=args.max_model_len)
    else:
        from dspark.generate import generate_speculative

        result = generate_speculative(target, prompt_ids, params, spec, on_tokens=stream,
                                      max_len=args.max_model_len)
    if args.json:
        out = {
            "text": result.text,
            "token_ids": result.token_ids,
            "num_prompt_tokens": result.prompt_tokens,
            "num_output_tokens": len(result.token_ids),
            "finish_reason": result.finish_reason,
            "elapsed_s": round(result.elapsed_s, 4),
            "time_to_first_token_s": round(result.first_token_s, 4),
            "tokens_per_s": round(result.tokens_per_s, 2),
            **result.stats,
        }
        print(json.dumps(out))
    else:
        print(detok.push([], finished=True))  # what was held back (a possible stop string's start)
        ms = 1000 / result.tokens_per_s if result.tokens_per_s == result.tokens_per_s else float("nan")
        line = (f"[{len(result.token_ids)} tokens, {result.tokens_per_s:.1f} tok/s "
                f"({ms:.1f} ms/token), first token {result.first_token_s * 1000:.0f} ms, "
                f"finish: {result.finish_reason}]")
        if "acceptance_length" in result.stats:
            st = result.stats
            per_pos = " ".join(f"{a:.2f}" for a in st["per_position_acceptance"])
            line += (f"\n[speculative {st['method']}: mean acceptance length {st['acceptance_length']:.2f} "
                     f"over {st['num_rounds']} rounds; per-position acceptance: {per_pos}]")
        print(line, file=sys.stderr)
    return 0
