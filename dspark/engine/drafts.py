"""One step's proposals for every decode row, from up to two sources: the drafter's
block for the rows it drafts, and prompt lookup alone for the rows the scheduler left
out of drafting (hybrid drafting only; a lookup token costs verification but no
drafter time). Rows that neither drafted are empty and verify nothing. `faulty_rows`
finds the drafter's rows that cannot be verified as they are (the runner decodes them
plain)."""

from __future__ import annotations

import math
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


def faulty_rows(out, greedy: list[bool]) -> set[int]:
    """Rows of a DraftOutput whose draft cannot be verified as it is: a confidence that is
    not a probability, or logits with NaN or +inf (-inf is a zero probability) or no
    finite entry at a position. Greedy verification reads only the drafted tokens, so
    greedy rows are checked at those tokens alone (a full pass over the vocabulary
    costs memory traffic comparable to a small forward). The few values checked per
    row are checked in plain Python (a dozen small tensor operations cost more)."""
    bad: set[int] = set()
    if out.logits is not None:
        lg = out.logits
        sampled = [i for i, g in enumerate(greedy) if not g]
        if sampled:
            peak = lg[sampled].amax(-1)  # NaN and +inf propagate; all -inf stays -inf
            bad.update(i for i, row in zip(sampled, torch.isfinite(peak).all(1).tolist()) if not row)
        at = lg.gather(-1, out.tokens.clamp_min(0).unsqueeze(-1)).squeeze(-1).tolist()  # [R][G]
        valid = out.num_valid.tolist() if out.num_valid is not None else [len(r) for r in at]
        bad.update(i for i, (row, v) in enumerate(zip(at, valid)) if not all(map(math.isfinite, row[:v])))
    if out.confidence is not None:
        # a NaN fails both comparisons
        bad.update(i for i, row in enumerate(out.confidence.float().tolist()) if not all(0 <= c <= 1 for c in row))
    return bad
