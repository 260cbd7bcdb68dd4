"""Plain greedy decoding speed of the runtime in each CPU precision, side by side.

Loads the default model once per precision (fp32, bf16w = bf16 weights with fp32
compute through the native kernel, and bf16 where the CPU has avx512_bf16), then
decodes the same chat prompts with `generate_plain`, interleaving the precisions per
prompt so machine noise hits all alike; reports the median tokens/s and the CPU's
ISA flags.

    python scripts/dev/bench_precisions.py [--precisions fp32,bf16w] [--max-tokens 64]
        [--repeats 2] [--threads 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

PROMPTS = ["Explain how a hash map works, with an example in Python.",
           "What is 17*23? Show your steps.",
           "Write a haiku about autumn."]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precisions", default=None, help="comma-separated (default: every one this CPU runs)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from dspark.generate import generate_plain
    from dspark.runtime import cpu_kernels
    from dspark.runtime.precision import cpu_has_bf16
    from dspark.runtime.target import Target
    from dspark.sampling import SamplingParams

    names = args.precisions.split(",") if args.precisions else (
        ["fp32"] + (["bf16"] if cpu_has_bf16() else []) + (["bf16w"] if cpu_kernels.available() else []))
    targets = {p: Target.load("default", dtype=p, max_len=1024) for p in names}
    speeds: dict[str, list[float]] = {p: [] for p in names}
    for _ in range(args.repeats):
        for q in PROMPTS:
            for p, t in targets.items():
                ids = t.tokenizer.chat_prompt(q)
                r = generate_plain(t, ids, SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True))
                speeds[p].append(r.tokens_per_s)
    flags = sorted(cpu_kernels.cpu_flags() & {"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"})
    result = {"command": " ".join(["python"] + sys.argv), "cpu_flags": flags, "threads": args.threads,
              "max_tokens": args.max_tokens,
              "median_tok_s": {p: statistics.median(v) for p, v in speeds.items()}, "runs": speeds}
    print(f"CPU flags: {' '.join(flags)}; {args.threads} threads; {args.max_tokens} tokens per prompt")
    for p, v in speeds.items():
        print(f"{p:6s} median {statistics.median(v):6.1f} tok/s  ({', '.join(f'{x:.1f}' for x in v)})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
