"""The drafter training loss, as pure functions of logits (no model inside).

For every drafted position n (block position k, counted from 0) with drafter logits
q_n over the DRAFT vocabulary (for DSpark including the Markov bias of the TRUE
previous token; tokens outside a reduced draft vocabulary have q = 0), the target's
distribution p_n at the same absolute position given as its top k (ids mapped to
draft indices, -1 outside the draft vocabulary; `tail_n` = the mass outside the top
k), label y_n (the next token of the data, as a draft index, -1 outside) and, for
DSpark, the raw confidence logit z_n:

    ce_n   = -log softmax(q_n)[y_n]                       (0 when y_n is outside)
    tv_n   = ½ l1_n,  l1_n = Σ_{top k, inside} |q - p| + Σ_{top k, outside} p
                           + |Q_rest - tail_n|,  Q_rest = q mass off the top k
    bce_n  = BCE(sigmoid(z_n), 1 - tv_n)                   (the target 1 - tv_n detached)
    loss   = Σ_n w_n (0.1 ce_n + 0.9 l1_n + 1.0 bce_n) / W

The exact ||q - p||_1 differs from l1_n only in how q and p split their mass over
the tokens outside the top k; it lies in [l1_n, l1_n + 2 tail_n], so the truncation
hides at most tail_n of the total-variation distance (reported in training logs).

Position weights: w_n = exp(-k/4) for block drafters and 0.8^k (the step weight) for
Eagle3's training-time test. 1 - tv_n is the probability that lossless sampling
verification accepts the drafted token given that everything before it was
accepted, so its mean per position is the analytic acceptance rate `accept_rate@k`.

W normalises the sum. Under data parallelism it is the weight summed over ALL ranks
(see `Trainer`), so the update does not depend on how a global batch is split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

CE_WEIGHT = 0.1
L1_WEIGHT = 0.9
BCE_WEIGHT = 1.0


def position_weights(positions: torch.Tensor, method: str, decay: float = 4.0) -> torch.Tensor:
    """w_k for block positions k (from 0): exp(-k/decay) (the paper: decay 4), or 0.8^k
    for Eagle3's unrolled steps. A smaller decay follows the expected survival of a
    weak drafter more closely (at acceptance α per position, survival to k is α^k)."""
    k = positions.float()
    if method == "eagle3":
        return torch.pow(0.8, k)
    return torch.exp(-k / decay)


@dataclass
class PositionTerms:
    """Per-position loss terms, each [N] (fp32)."""

    ce: torch.Tensor
    l1: torch.Tensor
    bce: torch.Tensor | None
    accept: torch.Tensor  # 1 - ½ l1, detached: the analytic acceptance probability

    def combined(self) -> torch.Tensor:
        """0.1 ce + 0.9 l1 + 1.0 bce per position: [N]."""
        out = CE_WEIGHT * self.ce + L1_WEIGHT * self.l1
        return out + BCE_WEIGHT * self.bce if self.bce is not None else out


def position_terms(
    q_logits: torch.Tensor,  # [N, draft vocab] drafter logits
    p_ids: torch.Tensor,  # [N, k] draft index of the target's top-k tokens (-1: outside the draft vocab)
    p_probs: torch.Tensor,  # [N, k] their target probabilities (no gradient needed)
    labels: torch.Tensor,  # [N] draft index of the next token (-1: outside the draft vocab)
    conf_logits: torch.Tensor | None = None,  # [N] raw confidence logits
) -> PositionTerms:
    log_q = F.log_softmax(q_logits.float(), dim=-1)  # [N, Vd]
    p = p_probs.detach().float()
    inside = p_ids >= 0
    q_top = log_q.gather(-1, p_ids.clamp(min=0)).exp() * inside  # [N, k]
    tail = (1 - p.sum(-1)).clamp(min=0)
    l1 = ((q_top - p).abs() * inside).sum(-1) + (p * ~inside).sum(-1) + (1 - q_top.sum(-1) - tail).abs()
    has_label = labels >= 0
    ce = -log_q.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1) * has_label
    accept = (1 - 0.5 * l1).detach().clamp(0.0, 1.0)
    bce = None
    if conf_logits is not None:
        bce = F.binary_cross_entropy_with_logits(conf_logits.float(), accept, reduction="none")
    return PositionTerms(ce, l1, bce, accept)


def greedy_match(q_logits: torch.Tensor, p_top_ids: torch.Tensor) -> torch.Tensor:
    """[N] bool: the drafter's argmax (draft index) equals the target's (draft index of
    its most probable token, -1 when outside the draft vocabulary): greedy acceptance."""
    return q_logits.argmax(-1) == p_top_ids


def weighted_sums(terms: PositionTerms, weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """Σ w·term for the loss and each term (the loss keeps its graph; the rest are detached)."""
    out = {"loss": (weights * terms.combined()).sum(),
           "ce": (weights * terms.ce).sum().detach(),
           "l1": (weights * terms.l1).sum().detach()}
    if terms.bce is not None:
        out["bce"] = (weights * terms.bce).sum().detach()
    return out


def per_position_means(values: torch.Tensor, positions: torch.Tensor, num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums and counts of `values` [N] per position 0..num_positions-1: two [num_positions] tensors."""
    sums = torch.zeros(num_positions, dtype=torch.float64, device=values.device)
    counts = torch.zeros(num_positions, dtype=torch.float64, device=values.device)
    sums.index_add_(0, positions, values.detach().double())
    counts.index_add_(0, positions, torch.ones_like(values, dtype=torch.float64))
    return sums, counts


def expected_acceptance_length(rates: list[float]) -> float:
    """τ = 1 + Σ_k Π_{j≤k} α_j from per-position acceptance rates (treating positions as
    independent given their means: an estimate, the engine measures the real τ)."""
    tau, survive = 1.0, 1.0
    for a in rates:
        if math.isnan(a):
            break
        survive *= a
        tau += survive
    return tau
