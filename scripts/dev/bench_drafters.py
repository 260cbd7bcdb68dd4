"""Drafter cost benchmark: the price of the Markov and confidence heads.

Side by side in one run on the default model (weights are random: cost does not
depend on them), one request with a 200-token context:
  * one drafting round of DSpark (Markov + confidence heads) vs DFlash (same
    backbone, no heads) at block 4, 8 and 16 (drafting block-1 tokens);
  * one full round (draft + verify of all drafted tokens in one target forward) for
    every drafter kind.
Configurations are interleaved per repeat and medians reported.

    python scripts/dev/bench_drafters.py [--repeats 15] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from dspark.drafters import create_drafter
    from dspark.drafters.base import DraftRequest
    from dspark.runtime.batch import FlatBatch
    from dspark.runtime.weight_formats import pack_cpu_bf16_linears
    from dspark.runtime.target import Target
    from dspark.sampling import SamplingParams

    target = Target.load("default", dtype=args.dtype, max_len=1024)
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, target.cfg.vocab_size, (args.context,), generator=g).tolist()

    def prepared(method: str, **sizes):
        d = create_drafter(method, target.model, seed=0, **sizes)
        pack_cpu_bf16_linears(d)  # as the engine does
        d.reserve(1, 1024)
        d.add_request(0)
        cache = target.new_cache(1, 1024)
        slot = cache.allocate(0)
        layers = list(d.target_layer_ids)
        _, hidden = target.model(FlatBatch.from_requests([ctx], [0], [slot], logits="none"), cache, layers)
        d.append_context([0], [ctx], [0], hidden)
        return d, cache, slot

    req = [DraftRequest(0, 42, args.context, SamplingParams(), None)]
    rows = []
    with torch.inference_mode():
        for block in (4, 8, 16):
            ds = prepared("dspark", block_size=block)[0]
            df = prepared("dflash", block_size=block)[0]
            t_ds, t_df = [], []
            for i in range(args.repeats + 2):
                t0 = time.perf_counter()
                ds.draft(req, block - 1)
                t1 = time.perf_counter()
                df.draft(req, block - 1)
                t2 = time.perf_counter()
                if i >= 2:
                    t_ds.append((t1 - t0) * 1000)
                    t_df.append((t2 - t1) * 1000)
            a, b = statistics.median(t_ds), statistics.median(t_df)
            rows.append({"block": block, "dspark_draft_ms": round(a, 2), "dflash_draft_ms": round(b, 2),
                         "heads_overhead_pct": round(100 * (a - b) / b, 1)})
            print(f"block {block:2d}: draft dspark {a:6.1f} ms  dflash {b:6.1f} ms  heads +{100 * (a - b) / b:.1f}%",
                  flush=True)

        full = []
        for method, gamma in (("dspark", 7), ("dflash", 7), ("eagle3", 7), ("mtp", 1), ("ngram", 7)):
            sizes = {"block_size": gamma + 1} if method in ("dspark", "dflash") else {}
            if method == "ngram":
                d = create_drafter("ngram", target.model, max_draft_tokens=gamma)
                d.reserve(1, 1024)
                d.add_request(0)
                d.append_context([0], [ctx], [0], None)
                cache = target.new_cache(1, 1024)
                slot = cache.allocate(0)
                target.model(FlatBatch.from_requests([ctx], [0], [slot], logits="none"), cache)
            else:
                d, cache, slot = prepared(method, **sizes)
            times = []
            for i in range(args.repeats + 2):
                cache.truncate(slot, args.context)
                t0 = time.perf_counter()
                out = d.draft(req, gamma)
                toks = [42] + [max(int(t), 0) for t in out.tokens[0].tolist()]
                target.model(FlatBatch.from_requests([toks], [args.context], [slot], logits="all"), cache,
                             list(d.target_layer_ids))
                if i >= 2:
                    times.append((time.perf_counter() - t0) * 1000)
            m = statistics.median(times)
            full.append({"method": method, "draft_tokens": gamma, "round_ms": round(m, 2)})
            print(f"full round {method:7s} (γ={gamma}): {m:6.1f} ms", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"draft": rows, "round": full, "dtype": args.dtype, "threads": args.threads}, f, indent=1)


if __name__ == "__main__":
    main()
