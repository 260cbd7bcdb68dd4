"""The drafter training loss, as pure functions of logits (no model inside).

For every drafted position n (block position k, counted from 0) with drafter logits
q_n (for DSpark including the Markov bias of the TRUE previous token), target logits
p_n at the same absolute position, label y_n (the next token of the data) and, for
DSpark, the raw confidence logit z_n:

    ce_n   = -log softmax(q_n)[y_n]
    tv_n   = ½ ||softmax(q_n) - softmax(p_n)||_1          (p detached)
    l1_n   = 2 tv_n
    bce_n  = BCE(sigmoid(z_n), 1 - tv_n)                   (the target 1 - tv_n detached)
    loss   = Σ_n w_n (0.1 ce_n + 0.9 l1_n + 1.0 bce_n) / W

with position weights w_n = exp(-k/4) for block drafters and 0.8^k (the step weight)
for Eagle3's training-time test. 1 - tv_n is the probability that lossless sampling
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


def position_weights(positions: torch.Tensor, method: str) -> torch.Tensor:
    """w_k for block positions k (from 0): exp(-k/4), or 0.8^k for Eagle3's unrolled steps."""
    k = positions.float()
    if method == "eagle3":
        return torch.pow(0.8, k)
    return torch.exp(-k / 4)


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
    q_logits: torch.Tensor,  # [N, vocab] drafter logits
    p_logits: torch.Tensor,  # [N, vocab] target logits (no gradient needed)
    labels: torch.Tensor,  # [N] int64 next tokens
    conf_logits: torch.Tensor | None = None,  # [N] raw confidence logits
) -> PositionTerms:
    q_logits = q_logits.float()
    log_q = F.log_softmax(q_logits, dim=-1)  # [N, vocab]
    p = F.softmax(p_logits.detach().float(), dim=-1)
    ce = F.nll_loss(log_q, labels, reduction="none")
    l1 = (log_q.exp() - p).abs().sum(-1)
    accept = (1 - 0.5 * l1).detach().clamp(0.0, 1.0)
    bce = None
    if conf_logits is not None:
        bce = F.binary_cross_entropy_with_logits(conf_logits.float(), accept, reduction="none")
    return PositionTerms(ce, l1, bce, accept)


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
