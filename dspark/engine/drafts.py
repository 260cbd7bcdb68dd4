"""One step's proposals for every decode row, from up to two sources: the drafter's
block for the rows it drafts, and prompt lookup alone for the rows the scheduler left
out of drafting (hybrid drafting only; a lookup token costs verification but no
drafter time). Rows that neither drafted are empty and verify nothing."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.drafters.base import DraftOutput


@dataclass
class StepDrafts:
    tokens: torch.Tensor  # [D, G] int64; -1 or 0 where nothing was proposed
    logits: torch.Tensor | None  # [D, G, V]; None: every proposal is a point mass
    confidence: torch.Tensor | None  # [D, G]; None: the drafter has no confidence head
    valid: list[int]  # per row, how many leading tokens are real proposals


def merge_drafts(num_rows: int, num_tokens: int, rows: list[int], drafted: DraftOutput | None,
                 looked: list[int], lookup: DraftOutput | None) -> StepDrafts:
    """The drafter's output for `rows` and lookup's for `looked` (disjoint row indices)
    as [num_rows, ...] tensors. Lookup rows get point-mass logits (0 at the token,
    -inf elsewhere) when the drafter's rows carry logits."""
    parts = [(rows, drafted), (looked, lookup)]
    parts = [(idx, out) for idx, out in parts if idx and out is not None]
    if len(parts) == 1 and len(parts[0][0]) == num_rows:  # one source drafted every row
        out = parts[0][1]
        valid = out.num_valid.tolist() if out.num_valid is not None else [out.tokens.shape[1]] * num_rows
        return StepDrafts(out.tokens, out.logits, out.confidence, valid)
    ref = parts[0][1]
    g = ref.tokens.shape[1] if ref is not None else num_tokens
    dev = ref.tokens.device
    tokens = torch.zeros(num_rows, g, dtype=torch.long, device=dev)
    logits = None
    if drafted is not None and rows and drafted.logits is not None:
        logits = drafted.logits.new_zeros(num_rows, *drafted.logits.shape[1:])
    with_conf = all(out.confidence is not None for _, out in parts)
    conf = torch.zeros(num_rows, g, device=dev) if with_conf else None
    valid = [0] * num_rows
    for idx, out in parts:
        at = torch.tensor(idx, dtype=torch.long, device=dev)
        tokens[at] = out.tokens.to(dev)
        if conf is not None:
            conf[at] = out.confidence.float().to(dev)
        counts = out.num_valid.tolist() if out.num_valid is not None else [g] * len(idx)
        for i, v in zip(idx, counts):
            valid[i] = int(v)
        if logits is None:
            continue
        if out.logits is not None:
            logits[at] = out.logits.to(logits.dtype)
        else:  # point masses
            for i, v in zip(idx, counts):
                logits[i, :, :] = float("-inf")
                if v:
                    logits[i, torch.arange(v, device=dev), tokens[i, :v]] = 0.0
    return StepDrafts(tokens, logits, conf, valid)
