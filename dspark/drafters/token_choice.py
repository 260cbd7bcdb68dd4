"""Picking one drafted token per request from its logits, per its sampling params.

Greedy requests take the argmax. Sampled requests apply the request's temperature,
top-k and top-p through `logits_to_probs` (the transform the verifier applies to the
same logits) and draw with a float64 uniform from the request's own generator, so a
request's draws do not depend on which other requests share the batch.
"""

from __future__ import annotations

import torch

from dspark.sampling import logits_to_probs, sample_from_probs

from .base import DraftRequest


def choose_tokens(
    logits: torch.Tensor,  # [R, vocab] fp32
    requests: list[DraftRequest],
) -> torch.Tensor:  # [R] int64
    out = logits.argmax(dim=-1)
    sampled = [i for i, r in enumerate(requests) if not r.params.greedy]
    if not sampled:
        return out
    dev = logits.device
    rows = torch.tensor(sampled, device=dev)
    params = [requests[i].params for i in sampled]
    probs = logits_to_probs(
        logits.index_select(0, rows),
        torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev),
        torch.tensor([p.top_k for p in params], dtype=torch.long, device=dev),
        torch.tensor([p.top_p for p in params], dtype=torch.float32, device=dev),
    )
    for row, i in enumerate(sampled):
        gen = requests[i].generator
        # The uniform is drawn on the generator's device (a CPU generator with CUDA logits).
        row_probs = probs[row] if gen is None or gen.device == dev else probs[row].to(gen.device)
        out[i] = sample_from_probs(row_probs, gen)
    return out
