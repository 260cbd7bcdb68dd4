"""Greedy exactness of the second target (Qwen2.5-Coder-0.5B-Instruct, a GGUF file)
against transformers fp32 on the same dequantized weights, plain and with speculation.

    scripts/fetch_qwen_coder.sh                       # once: the 491 MB GGUF
    python3 scripts/dev/check_second_target.py [FILE.gguf] [--max-tokens 48] [--threads 2] \
        [--drafter DIR] [--dtype auto|gguf|q8x|fp32]  # a DSpark drafter trained for it

Two prompts per domain (math, code, chat). Configurations: plain decoding, n-gram
speculation (7 tokens), hybrid lookup + a DSpark drafter with adaptive verification
(the shipped recipe; a random drafter when --drafter is not given, which tests
exactness, not speed). Prints one line per prompt and configuration and exits 1 on any
difference from transformers' greedy output.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

PROMPTS = [
    "What is 17 times 23? Answer step by step.",
    "A train travels 120 km in 1.5 hours. What is its average speed?",
    "Write a Python function that reverses a string.",
    "Write a SQL query that counts the rows of a table named users.",
    "Explain recursion in one sentence.",
    "Give three tips for writing clear documentation.",
]


def main() -> int:
    from dspark.runtime.cache import cache_root

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", nargs="?", default=str(cache_root() / "gguf" / "qwen2.5-coder-0.5b-instruct.gguf"))
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafter", help="DSpark drafter directory trained for this target")
    ap.add_argument("--dtype", default="fp32", help="our precision (auto: what a user's file gets; default: %(default)s)")
    args = ap.parse_args()
    if not Path(args.gguf).is_file():
        print(f"{args.gguf} not found: run scripts/fetch_qwen_coder.sh first", file=sys.stderr)
        return 2

    import torch

    from dspark.engine.config import SpeculativeConfig
    from dspark.eval.exactness import check_greedy
    from dspark.runtime.target import Target

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    target = Target.load(args.gguf, dtype=args.dtype, device="cpu", max_len=1024, log=print)
    print(f"loaded {target.path} in {time.perf_counter() - t0:.1f} s", flush=True)
    configs = {
        "plain": None,
        "ngram": SpeculativeConfig(method="ngram", num_speculative_tokens=7),
        "hybrid": SpeculativeConfig(method="dspark", model=args.drafter or "random", lookup=True,
                                    enable_adaptive_verification=True),
    }

    def show(row):
        print(f"{'same' if row.equal else 'DIFFERENT'} [{row.config}] {row.prompt!r}: {len(row.ours)} tokens"
              + ("" if row.equal else f"\n  ours {row.ours}\n  transformers {row.reference}"), flush=True)

    rows = check_greedy(target, PROMPTS, configs, args.max_tokens, on_row=show)
    bad = sum(not r.equal for r in rows)
    print(f"{len(rows) - bad}/{len(rows)} (prompt, configuration) pairs equal to transformers fp32")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
