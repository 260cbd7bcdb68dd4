"""One step's proposals for every decode row, from up to two sources: the drafter's
block for the rows it drafts, and prompt lookup alone for the rows the scheduler left
out of drafting (hybrid drafting only; a lookup token costs verification but no
drafter time). Rows that neither drafted are empty and verify nothing."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.drafters.base import DraftOutput, stack_drafts


@dataclass
class StepDrafts:
    tokens: torch.Tensor  # [D, G] int64; -1 or 0 where nothing was proposed
    logits: torch.Tensor | None  # [D, G, V]; None: every proposal is a point mass
    confidence: torch.Tensor | None  # [D, G]; None: the drafter has no confidence head
    valid: list[int]  # per row, how many leading tokens are real proposals


def merge_drafts(num_rows: int, rows: list[int], drafted: DraftOutput | None,
                 looked: list[int], lookup: DraftOutput | None) -> StepDrafts:
    """The drafter's output for `rows` and lookup's for `looked` (disjoint row indices)
    as [num_rows, ...] tensors (`stack_drafts`: lookup rows get point-mass logits when
    the drafter's rows carry logits)."""
    parts = [(idx, out) for idx, out in [(rows, drafted), (looked, lookup)] if idx and out is not None]
    if len(parts) == 1 and len(parts[0][0]) == num_rows:  # one source drafted every row, in order
        out = parts[0][1]
        valid = out.num_valid.tolist() if out.num_valid is not None else [out.tokens.shape[1]] * num_rows
        return StepDrafts(out.tokens, out.logits, out.confidence, valid)
    out = stack_drafts(num_rows, parts)
    return StepDrafts(out.tokens, out.logits, out.confidence, out.num_valid.tolist())
