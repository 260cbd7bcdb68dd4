"""Greedy exactness of the second target (Qwen2.5-Coder-0.5B-Instruct, a GGUF file)
against transformers fp32 on the same dequantized weights.

    scripts/fetch_qwen_coder.sh                       # once: the 491 MB GGUF
    python3 scripts/check_second_target.py [FILE.gguf] [--max-tokens 12] [--threads 1]

For each prompt, the reply's first tokens from `generate_plain` (our runtime, fp32)
and from transformers' greedy `generate` on the cached HF directory must be equal.
Prints one line per prompt and exits 1 on any difference. Slow on a busy CPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

PROMPTS = [
    "Write a Python function that reverses a string.",
    "What does the SQL keyword JOIN do?",
    "Explain recursion in one sentence.",
]


def main() -> int:
    from dspark.runtime.default_model import cache_root

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", nargs="?", default=str(cache_root() / "gguf" / "qwen2.5-coder-0.5b-instruct.gguf"))
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if not Path(args.gguf).is_file():
        print(f"{args.gguf} not found: run scripts/fetch_qwen_coder.sh first", file=sys.stderr)
        return 2

    import torch
    from transformers import AutoModelForCausalLM

    from dspark.generate import generate_plain
    from dspark.runtime.target import Target
    from dspark.sampling import SamplingParams

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    target = Target.load(args.gguf, dtype="fp32", device="cpu", max_len=512)
    print(f"loaded {target.path} in {time.perf_counter() - t0:.1f} s", flush=True)
    ref = AutoModelForCausalLM.from_pretrained(str(target.path), dtype=torch.float32).eval()
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    failures = 0
    for prompt in PROMPTS:
        ids = target.tokenizer.chat_prompt(prompt)
        ours = generate_plain(target, ids, params, max_len=512).token_ids
        with torch.no_grad():
            out = ref.generate(torch.tensor([ids]), max_new_tokens=len(ours), do_sample=False,
                               eos_token_id=target.tokenizer.eos_token_ids, pad_token_id=target.tokenizer.eos_token_ids[0])
        theirs = out[0, len(ids):].tolist()
        same = ours == theirs
        failures += not same
        print(f"{'same' if same else 'DIFFERENT'}: {prompt!r} -> {target.tokenizer.decode(ours)!r}"
              + ("" if same else f"\n  ours {ours}\n  transformers {theirs}"), flush=True)
    print(f"{len(PROMPTS) - failures}/{len(PROMPTS)} prompts equal to transformers fp32")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
