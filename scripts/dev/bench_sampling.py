"""Sampled decoding with the full-sort top-k/top-p transform against the current one.

The engine decodes the same held-out prompts with temperature 0.7, top-k 20, top-p 0.8
(the data-generation recipe) and with top-p 0.9 alone (an OpenAI client's usual
sampling), once with `dspark.sampling.logits_to_probs` and once with the earlier
transform, which sorted the whole vocabulary of every row; rounds alternate, and each
round's ratio is reported with the median and spread. Also the transform alone on
R rows of the default model's vocabulary.

    python3 scripts/dev/bench_sampling.py --rounds 5 --batch 1,16
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import dspark.sampling as sampling
import dspark.verify.rejection as rejection
from dspark.bench.dataset import heldout_prompts
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams

CURRENT = sampling.logits_to_probs


def full_sort(logits, temperature, top_k=0, top_p=1.0):
    """The earlier transform: every row with top-k or top-p sorts the whole vocabulary."""
    x = logits.float()
    x = x / (temperature.unsqueeze(-1) if isinstance(temperature, torch.Tensor) else temperature)
    k_any = bool((top_k > 0).any()) if isinstance(top_k, torch.Tensor) else top_k > 0
    p_any = bool((top_p < 1).any()) if isinstance(top_p, torch.Tensor) else top_p < 1
    if k_any or p_any:
        sorted_x, order = x.sort(dim=-1, descending=True)
        v = x.shape[-1]
        drop = torch.zeros_like(sorted_x, dtype=torch.bool)
        if k_any:
            k = top_k if isinstance(top_k, torch.Tensor) else torch.full(x.shape[:-1], top_k)
            drop |= torch.arange(v) >= torch.where(k > 0, k, torch.full_like(k, v)).unsqueeze(-1)
        if p_any:
            p = top_p if isinstance(top_p, torch.Tensor) else torch.full(x.shape[:-1], float(top_p))
            probs = torch.softmax(sorted_x.masked_fill(drop, float("-inf")), dim=-1)
            drop |= (probs.cumsum(-1) - probs) >= p.unsqueeze(-1)
        x = torch.empty_like(x).scatter_(-1, order, sorted_x.masked_fill(drop, float("-inf")))
    return torch.softmax(x, dim=-1)


def use(fn) -> None:
    sampling.logits_to_probs = fn
    rejection.logits_to_probs = fn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", default="1,16", help="requests decoded together")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args()
    torch.set_num_threads(2)
    target = Target.load("default", dtype=args.dtype, device="cpu", max_len=2048)
    vocab = target.model.cfg.vocab_size
    print(f"precision {target.model.precision}; vocabulary {vocab}")
    for rows in (1, 16, 48):
        x = torch.randn(rows, vocab) * 4
        t, k, p = torch.full((rows,), 0.7), torch.full((rows,), 20), torch.full((rows,), 0.8)
        times = {}
        for name, fn in (("full sort", full_sort), ("current", CURRENT)):
            fn(x, t, k, p)
            t0 = time.perf_counter()
            for _ in range(10):
                fn(x, t, k, p)
            times[name] = (time.perf_counter() - t0) / 10 * 1e3
        print(f"transform alone, {rows} rows (top-k 20, top-p 0.8): full sort {times['full sort']:.2f} ms, "
              f"current {times['current']:.2f} ms ({times['full sort'] / times['current']:.1f}x)")
    prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", 48)]
    recipes = {"top-k 20, top-p 0.8, T 0.7": dict(temperature=0.7, top_k=20, top_p=0.8),
               "top-p 0.9, T 1.0": dict(temperature=1.0, top_p=0.9)}
    for batch in [int(b) for b in args.batch.split(",")]:
        engine = LLMEngine(target, None, EngineConfig(max_num_seqs=batch, max_model_len=2048))
        for label, kw in recipes.items():
            ratios, rates = [], {"full sort": [], "current": []}
            for r in range(args.rounds):
                chunk = [prompts[(r * batch + i) % len(prompts)] for i in range(batch)]
                params = [SamplingParams(max_tokens=args.max_tokens, seed=1000 * r + i, ignore_eos=True, **kw)
                          for i in range(batch)]
                order = (("full sort", full_sort), ("current", CURRENT))
                for name, fn in (order if r % 2 == 0 else order[::-1]):
                    use(fn)
                    t0 = time.perf_counter()
                    seqs = engine.generate(chunk, params)
                    rates[name].append(sum(len(s.output_ids) for s in seqs) / (time.perf_counter() - t0))
                ratios.append(rates["current"][-1] / rates["full sort"][-1])
            use(CURRENT)
            print(f"batch {batch}, {label}: full sort {statistics.median(rates['full sort']):.1f} tok/s, "
                  f"current {statistics.median(rates['current']):.1f} tok/s; current / full sort "
                  f"{statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
