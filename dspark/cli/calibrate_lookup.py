"""`dspark calibrate-lookup`: fit the confidence table of prompt lookup for hybrid drafting."""

from __future__ import annotations

import argparse
import sys

from .common import add_model_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate-lookup",
        help="fit prompt lookup's per-position confidences (hybrid drafting) on the target's own greedy replies",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Hybrid drafting (`\"lookup\": true` in --speculative-config) picks, per drafted position, "
                    "the prompt-lookup token or the DSpark token by calibrated confidence. The lookup side's "
                    "confidence is the measured P(token k accepted | tokens before it accepted) by match class "
                    "(matched n-gram length; whether earlier occurrences agreed) and position k.\n\n"
                    "This command measures it: the target answers training-split prompts greedily (or --data "
                    "gives replies it generated greedily), and at every reply position the lookup proposal is "
                    "compared with the reply's next tokens, which is exactly what greedy verification would "
                    "accept. The table is written to --out; the server keeps updating its copy online.",
    )
    p.add_argument("--out", required=True, metavar="JSON", help="where to write the table")
    p.add_argument("--data", action="append", default=[], metavar="RECORDS.jsonl",
                   help="greedy replies of the target (dspark data generate --temperature 0); repeatable. "
                        "Without it, replies are generated now")
    p.add_argument("--split", default="train", choices=["train", "heldout"],
                   help="prompt split to answer when generating (default: %(default)s)")
    p.add_argument("--prompts-per-domain", type=int, default=24, help="(default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=192, help="reply length when generating (default: %(default)s)")
    p.add_argument("--block", type=int, default=7, help="longest lookup proposal counted (default: %(default)s)")
    p.add_argument("--prompt-lookup-max", type=int, default=3, help="longest n-gram matched (default: %(default)s)")
    p.add_argument("--prompt-lookup-min", type=int, default=1, help="shortest n-gram matched (default: %(default)s)")
    p.add_argument("--batch", type=int, default=8, help="requests decoded together when generating (default: %(default)s)")
    add_model_args(p)
    p.set_defaults(func=run)


def _generate(args, target) -> list[tuple[list[int], list[int]]]:
    from tqdm import tqdm

    from dspark.data import load_prompts
    from dspark.data.prompts import DOMAINS, stable_rank
    from dspark.engine.engine import EngineConfig, LLMEngine
    from dspark.sampling import SamplingParams

    prompts = []
    for domain in DOMAINS:
        ps = sorted(load_prompts(args.split, domain), key=lambda p: stable_rank(p.id))[: args.prompts_per_domain]
        prompts += [target.tokenizer.apply_chat_template(p.messages) for p in ps]
    prompts = [x for x in prompts if len(x) + args.max_tokens < args.max_model_len]
    engine = LLMEngine(target, None, EngineConfig(max_num_seqs=args.batch, max_model_len=args.max_model_len))
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    seqs = [engine.add_request(x, params) for x in prompts]
    bar = tqdm(total=len(seqs), desc="greedy replies", unit="reply", file=sys.stderr)
    done = 0
    while engine.has_unfinished():
        engine.step()
        finished = sum(s.is_finished for s in seqs)
        if finished > done:
            bar.update(finished - done)
            done = finished
    bar.close()
    return [(s.prompt_ids, s.output_ids) for s in seqs]


def _read(paths: list[str]) -> list[tuple[list[int], list[int]]]:
    from dspark.data.records import read_records
    from dspark.errors import UserError

    out = []
    for path in paths:
        for rec in read_records(path):
            gen = rec.get("generator") or {}
            if gen.get("temperature", 0) not in (0, 0.0):
                raise UserError(f"{path}: replies were sampled (temperature {gen.get('temperature')}); lookup "
                                "calibration needs greedy replies (dspark data generate --temperature 0)")
            out.append((rec["prompt_token_ids"], rec["response_token_ids"]))
    return out


def run(args: argparse.Namespace) -> int:
    from dspark.drafters.lookup import fit_lookup_calibration
    from dspark.errors import UserError

    if args.block < 1 or args.prompts_per_domain < 1 or not 1 <= args.prompt_lookup_min <= args.prompt_lookup_max:
        raise UserError("--block and --prompts-per-domain must be >= 1 and 1 <= --prompt-lookup-min <= "
                        "--prompt-lookup-max")
    if args.data:
        pairs, source = _read(args.data), ", ".join(args.data)
    else:
        from .common import load_target

        target = load_target(args)
        pairs = _generate(args, target)
        source = (f"{len(pairs)} greedy replies of {args.model} to {args.split} prompts "
                  f"({args.prompts_per_domain} per domain, {args.max_tokens} tokens)")
    if not pairs:
        raise UserError("no replies to fit on")
    cal = fit_lookup_calibration(pairs, args.block, args.prompt_lookup_max, args.prompt_lookup_min, fitted_on=source)
    cal.save(args.out)
    table = cal.table()
    print(f"lookup confidence P(k accepted | 1..k-1 accepted), fitted on {source}")
    print("class (n-gram, a=agreed/c=contested) | trials@1 | " + " ".join(f"k={k + 1:<4}" for k in range(args.block)))
    for key, row in table.items():
        print(f"{key:>6} | {int(cal.trials[key][0]):>8} | " + " ".join(f"{x:<6.3f}" for x in row[: args.block]))
    print(f"wrote {args.out}")
    return 0
