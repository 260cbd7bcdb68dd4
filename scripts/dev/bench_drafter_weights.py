"""A learned drafter's draft call by how its linears are stored (`drafter_weights`):
bf16 (the target's bf16 kernel), q8_0 or q4_0 (quantized at load, the q8x kernel).

One request over a held-out prompt; between two timed draft calls the target decodes one
token, as in a real step, so the drafter's weights come from memory as they would when
the target's stream through the cache. The formats are interleaved per repeat.

    python3 scripts/dev/bench_drafter_weights.py --model FILE.gguf [--dtype auto] [--repeats 40]

Reads as: the draft call's time (median, [quartiles]) and the drafter's linear bytes."""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--weights", default="bf16,q8_0,q4_0")
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args()

    from dspark.drafters.base import DraftRequest
    from dspark.drafters.build import drafter_from_spec
    from dspark.engine.config import SpeculativeConfig
    from dspark.eval.acceptance import heldout_prompt_ids
    from dspark.runtime.batch import FlatBatch
    from dspark.runtime.target import Target
    from dspark.runtime.weight_formats import weight_kind
    from dspark.sampling import SamplingParams

    target = Target.load(args.model, dtype=args.dtype, max_len=2048)
    ctx = heldout_prompt_ids(target.tokenizer, ["chat"], 1, 768)["chat"][0]
    kinds = [w.strip() for w in args.weights.split(",")]
    lanes = {}
    with torch.inference_mode():
        for w in kinds:
            spec = SpeculativeConfig(method="dspark", num_speculative_tokens=7, verification_policy="fixed",
                                     drafter_weights=w)
            d = drafter_from_spec(spec, target)
            d.reserve(1, 2048)
            d.add_request(0)
            cache = target.new_cache(1, 2048)
            slot = cache.allocate(0)
            _, hidden = target.model(FlatBatch.from_requests([ctx], [0], [slot], logits="none"), cache,
                                     list(d.target_layer_ids))
            d.append_context([0], [ctx], [0], hidden)
            nbytes = 0
            for mod in d.modules():
                if isinstance(mod, torch.nn.Linear):
                    kind = weight_kind(mod)
                    fwd = mod.__dict__.get("forward")
                    nbytes += fwd.packed.nbytes if kind == "q" else mod.weight.numel() * mod.weight.element_size()
            lanes[w] = (d, cache, slot, nbytes, [])
        req = [DraftRequest(0, ctx[-1], len(ctx), SamplingParams(), None)]
        for i in range(args.repeats + 2):
            for w in (kinds if i % 2 == 0 else kinds[::-1]):
                d, cache, slot, _, times = lanes[w]
                cache.truncate(slot, len(ctx))
                target.model(FlatBatch.from_requests([[ctx[-1]]], [len(ctx)], [slot], logits="last"), cache,
                             list(d.target_layer_ids))  # the target's weights through the cache first
                cache.truncate(slot, len(ctx))
                t0 = time.perf_counter()
                d.draft(req, 7)
                if i >= 2:
                    times.append((time.perf_counter() - t0) * 1e3)
    print(f"{args.model} ({args.dtype}), one request, context {len(ctx)}, 7 drafted tokens, "
          f"{torch.get_num_threads()} threads, {args.repeats} repeats")
    for w, (_, _, _, nbytes, times) in lanes.items():
        q = statistics.quantiles(times, n=4)
        print(f"  {w:5s} draft {statistics.median(times):6.2f} ms [{q[0]:.2f}-{q[2]:.2f}]  "
              f"linears {nbytes / 2**20:6.1f} MiB")


if __name__ == "__main__":
    main()
