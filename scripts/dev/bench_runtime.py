"""Runtime benchmark: dspark's target forward vs transformers' eager forward.

Side by side in one run, on the default model, one request with a 200-token KV
context, for 1, 8, 64 and 256 new tokens; then plain greedy decoding speed of
`generate_plain` on MT-Bench-like prompts with 128 output tokens. Interleaves the
two implementations per repeat so machine noise hits both alike, and reports medians.

    python scripts/dev/bench_runtime.py [--dtype bf16] [--repeats 15] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--sizes", default="1,8,64,256")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, DynamicCache

    from dspark.generate import generate_plain
    from dspark.runtime.batch import FlatBatch
    from dspark.runtime.target import Target
    from dspark.sampling import SamplingParams

    target = Target.load("default", dtype=args.dtype, max_len=1024)
    dtype = target.dtype
    hf = AutoModelForCausalLM.from_pretrained(str(target.path), dtype=dtype).eval()
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, target.cfg.vocab_size, (args.context,), generator=g)
    sizes = [int(x) for x in args.sizes.split(",")]
    results = []
    with torch.inference_mode():
        # transformers: prefill the context once, then time a forward of n new tokens
        # on a copy of that cache (crop back after each run).
        hf_cache = DynamicCache()
        hf(ctx.unsqueeze(0), past_key_values=hf_cache, use_cache=True)
        cache = target.new_cache(1, args.context + max(sizes) + 1)
        slot = cache.allocate(0)
        target.model(FlatBatch.from_requests([ctx.tolist()], [0], [slot], logits="none"), cache)
        for n in sizes:
            new = torch.randint(0, target.cfg.vocab_size, (n,), generator=g)
            ours_t, hf_t = [], []
            batch = FlatBatch.from_requests([new.tolist()], [args.context], [slot], logits="all")
            pos = torch.arange(args.context, args.context + n).unsqueeze(0)
            for i in range(args.repeats + 2):
                cache.truncate(slot, args.context)
                t0 = time.perf_counter()
                target.model(batch, cache)
                t1 = time.perf_counter()
                hf(new.unsqueeze(0), past_key_values=hf_cache, position_ids=pos, use_cache=True)
                t2 = time.perf_counter()
                hf_cache.crop(-n)  # drop the n new tokens again
                if i >= 2:
                    ours_t.append((t1 - t0) * 1000)
                    hf_t.append((t2 - t1) * 1000)
            o, h = statistics.median(ours_t), statistics.median(hf_t)
            results.append({"new_tokens": n, "dspark_ms": round(o, 2), "transformers_ms": round(h, 2),
                            "ratio": round(o / h, 3)})
            print(f"{n:4d} new tokens: dspark {o:7.1f} ms   transformers {h:7.1f} ms   ratio {o / h:.2f}", flush=True)

    prompts = [
        "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences and must-see attractions.",
        "Draft a professional email seeking your supervisor's feedback on the 'Quarterly Financial Report' you prepared.",
        "Imagine you are writing a blog post comparing two popular smartphone models. Develop an outline for the blog post.",
        "Write a persuasive email to convince your introverted friend to volunteer as a guest speaker at a local event.",
        "Describe a vivid and unique character, using strong imagery and creative language.",
    ]
    tps = []
    for p in prompts:
        ids = target.tokenizer.chat_prompt(p)
        r = generate_plain(target, ids, SamplingParams(max_tokens=args.decode_tokens, ignore_eos=True))
        tps.append(r.tokens_per_s)
    med = statistics.median(tps)
    print(f"plain greedy decoding, {args.decode_tokens} tokens: median {med:.1f} tok/s ({1000 / med:.1f} ms/token) "
          f"over {len(prompts)} prompts: {[round(x, 1) for x in tps]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"forward": results, "decode_tokens_per_s": tps, "decode_median": med,
                       "dtype": args.dtype, "threads": args.threads}, f, indent=1)


if __name__ == "__main__":
    main()
