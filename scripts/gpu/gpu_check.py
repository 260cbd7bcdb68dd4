"""The CUDA path, checked in one short run (under 10 minutes on one GPU).

1. Exactness: for each precision (bf16, fp32), greedy output of the default model with
   the shipped DSpark drafter (fixed length 7) against plain greedy decoding, and a
   prompt prefilled in chunks against a whole prefill, on `--prompts` chat prompts.
   cuBLAS picks kernels by shape, so near-ties may differ: the script counts them.
2. Throughput: engine tokens/s (no HTTP) at concurrency 1, 16 and 64, plain and with
   DSpark (adaptive verification needs a step-time table: fixed length 3 here).

Writes a JSON report (`--out`) and prints a summary. Exits 1 if CUDA is missing.

    python3 scripts/gpu/gpu_check.py --out gpu_check.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

PROMPTS = [
    "How many legs do three spiders have?",
    "Write a Python function that reverses a string.",
    "What is 17 times 23? Explain step by step.",
    "Name three primary colors.",
    "Describe the water cycle in two sentences.",
    "Write a haiku about the sea.",
    "What does CPU stand for?",
    "Give me a synonym for happy.",
]


def exactness(target, spec_cls, n_prompts: int, max_tokens: int) -> dict:
    from dspark.engine.engine import EngineConfig, LLMEngine
    from dspark.generate import generate_plain
    from dspark.sampling import SamplingParams

    prompts = [target.tokenizer.chat_prompt(p) for p in PROMPTS[:n_prompts]]
    params = SamplingParams(max_tokens=max_tokens)
    plain = [generate_plain(target, p, params).token_ids for p in prompts]
    spec = spec_cls(method="dspark", num_speculative_tokens=7)
    engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=8, max_model_len=1024))
    specd = [s.output_ids for s in engine.generate(prompts, params)]
    chunked = LLMEngine(target, None, EngineConfig(max_num_seqs=8, max_model_len=1024, max_prefill_tokens=7))
    chunk_out = [s.output_ids for s in chunked.generate(prompts, params)]
    return {"prompts": len(prompts),
            "speculative_differs": sum(a != b for a, b in zip(plain, specd)),
            "chunked_prefill_differs": sum(a != b for a, b in zip(plain, chunk_out))}


def throughput(target, spec, concurrency: int, max_tokens: int) -> float:
    from dspark.engine.engine import EngineConfig, LLMEngine
    from dspark.sampling import SamplingParams

    prompts = [target.tokenizer.chat_prompt(PROMPTS[i % len(PROMPTS)]) for i in range(concurrency)]
    engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=concurrency, max_model_len=1024))
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    engine.generate(prompts[:1], SamplingParams(max_tokens=4))  # warm-up
    t0 = time.perf_counter()
    seqs = engine.generate(prompts, params)
    return sum(len(s.output_ids) for s in seqs) / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA device visible to torch", file=sys.stderr)
        return 1
    from dspark.engine.config import SpeculativeConfig
    from dspark.runtime.target import Target

    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "exactness": {}, "tok_s": {}}
    for dtype in ("bf16", "fp32"):
        target = Target.load("default", dtype=dtype, device="cuda", max_len=1024)
        report["exactness"][dtype] = exactness(target, SpeculativeConfig, args.prompts, args.max_tokens)
        print(dtype, report["exactness"][dtype], flush=True)
        if dtype == "bf16":
            for c in (1, 16, 64):
                for name, spec in (("plain", None), ("dspark-3", SpeculativeConfig(method="dspark",
                                                                                    num_speculative_tokens=3))):
                    tps = throughput(target, spec, c, 128)
                    report["tok_s"][f"{name}@c{c}"] = round(tps, 1)
                    print(f"{name} c={c}: {tps:.1f} tok/s", flush=True)
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
