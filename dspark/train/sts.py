"""Sequential Temperature Scaling (STS) of DSpark's confidence head.

The scheduler reads survival s_k = c_1 · ... · c_k, the predicted probability that
drafted tokens 1..k are all accepted, so that is the quantity to calibrate. For
k = 1..γ in order, a 1-D grid search picks the temperature T_k of position k
(c_k = sigmoid(z_k / T_k)) minimising the ECE of s_k against the observed prefix
acceptance, with T_1..T_{k-1} already fixed. A temperature never changes the order
of confidences at a position. Where several temperatures reach the same ECE (a
position no block ever reaches accepted), the one nearest 1 is kept.

Observed prefix acceptance, on held-out responses with teacher forcing (each block
conditioned on the data's true context and, for the Markov head, the data's true
previous token):

* `greedy` (default): a_k = 1 iff every drafted token j <= k equals the target's
  argmax at j. When the held-out responses are the target's own greedy output (as
  `dspark data generate --temperature 0` writes them), an accepted prefix IS the data
  prefix, so this is exactly what greedy decoding observes; on sampled responses it
  asks whether the drafts match the target's greedy choice given the data context.
* `analytic`: a_k = Π_{j<=k} (1 - ½||q_j - p_j||_1), the probability that lossless
  sampling verification (temperature 1) accepts the prefix; the confidence head's
  own training target.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dspark.calibration import DEFAULT_BINS, auroc, brier, ece

from .data import TrainSequence, visit_batches
from .objectives import AnchorBatch, block_forward

ACCEPTANCE_KINDS = ("greedy", "analytic")
DEFAULT_GRID = np.geomspace(0.05, 20.0, 481)  # includes 1.0
TIE_TOLERANCE = 1e-6


@dataclass
class ConfidenceSet:
    """Per block: raw confidence logits, prefix acceptance and validity, each [M, γ]."""

    logits: torch.Tensor
    accepted: torch.Tensor
    valid: torch.Tensor

    def survival(self, temperatures: list[float]) -> torch.Tensor:
        t = torch.tensor(temperatures, dtype=torch.float64)
        return torch.cumprod(torch.sigmoid(self.logits.double() / t), dim=1)


@torch.no_grad()
def collect_confidences(
    drafter,
    teacher,
    seqs: list[TrainSequence],
    blocks_per_seq: int = 32,
    batch_size: int = 4,
    acceptance: str = "greedy",
    seed: int = 0,
    progress: bool = False,
) -> ConfidenceSet:
    """Teacher-forced drafts over every anchor of `seqs` (the teacher's sequences), in
    visits of at most `blocks_per_seq` anchors."""
    from tqdm import tqdm

    from dspark.train.losses import position_terms

    if acceptance not in ACCEPTANCE_KINDS:
        raise ValueError(f"acceptance must be one of {ACCEPTANCE_KINDS}, got {acceptance!r}")
    gamma = drafter.max_draft_tokens
    logits_out, acc_out, valid_out = [], [], []
    dev = drafter.device
    for idx, anchors in tqdm(visit_batches(seqs, blocks_per_seq, batch_size, seed), desc="calibration data",
                             disable=not progress, dynamic_ncols=True):
        batch = AnchorBatch.build([seqs[i].tokens for i in idx], anchors, gamma, dev)
        hidden, targets = teacher.teach(idx, batch.target_rows())
        drafted = block_forward(drafter, batch, hidden.to(drafter.dtype))
        valid = batch.valid  # [B, A, γ]
        p_ids = drafter.to_draft_ids(targets.ids)
        if acceptance == "greedy":
            ok = (drafted.logits.argmax(-1) == p_ids[:, 0]).double()
        else:
            labels = drafter.to_draft_ids(batch.labels())
            ok = position_terms(drafted.logits, p_ids, targets.probs, labels).accept.double()
        full_ok = torch.zeros(valid.shape, dtype=torch.float64, device=dev)
        full_z = torch.zeros(valid.shape, dtype=torch.float64, device=dev)
        full_ok[valid] = ok
        full_z[valid] = drafted.conf_logits.double()
        real = batch.anchor_mask
        logits_out.append(full_z[real].cpu())
        acc_out.append(torch.cumprod(full_ok[real], dim=1).cpu())
        valid_out.append(valid[real].cpu())
    return ConfidenceSet(torch.cat(logits_out), torch.cat(acc_out), torch.cat(valid_out))


def fit_sts(data: ConfidenceSet, grid: np.ndarray = DEFAULT_GRID, num_bins: int = DEFAULT_BINS) -> list[float]:
    """Temperatures T_1..T_γ, fitted position by position (see the module docstring)."""
    m, gamma = data.logits.shape
    temps: list[float] = []
    prev = torch.ones(m, dtype=torch.float64)
    grid_t = torch.tensor(grid, dtype=torch.float64)
    for k in range(gamma):
        v = data.valid[:, k]
        if not bool(v.any()):
            temps.append(1.0)
            continue
        z, y, base = data.logits[v, k].double(), data.accepted[v, k], prev[v]
        cand = base.unsqueeze(0) * torch.sigmoid(z.unsqueeze(0) / grid_t.unsqueeze(1))  # [G, M_k]
        errors = np.array([ece(cand[g], y, num_bins) for g in range(len(grid))])
        # Ties (e.g. a position that is never reached) keep the temperature nearest 1.
        near_best = np.flatnonzero(errors <= np.nanmin(errors) + TIE_TOLERANCE)
        best = float(grid[near_best[np.argmin(np.abs(np.log(grid[near_best])))]])
        temps.append(best)
        prev = prev * torch.sigmoid(data.logits[:, k].double() / best)
    return temps


def calibration_report(data: ConfidenceSet, temperatures: list[float], num_bins: int = DEFAULT_BINS) -> dict:
    """ECE per position and pooled, Brier and AUROC of survival vs prefix acceptance."""
    s = data.survival(temperatures)
    per_pos = [ece(s[data.valid[:, k], k], data.accepted[data.valid[:, k], k], num_bins)
               for k in range(s.shape[1])]
    c, y = s[data.valid], data.accepted[data.valid]
    return {"ece": ece(c, y, num_bins), "brier": brier(c, y), "auroc": auroc(c, y),
            "per_position_ece": per_pos,
            "mean_survival": [float(s[data.valid[:, k], k].mean()) for k in range(s.shape[1])],
            "observed_acceptance": [float(data.accepted[data.valid[:, k], k].mean()) for k in range(s.shape[1])]}
