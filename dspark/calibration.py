"""Calibration metrics of confidence estimates: ECE, Brier score, AUROC and the
reliability bins. Pure functions of (confidence, outcome) arrays.

A leaf that imports nothing of dspark: the drafters (the lookup calibration's fit),
the engine (its calibration watch), training (STS temperatures) and the offline
evaluation (`dspark.eval.calibration`'s reliability diagram) all score confidence
with it, none importing another for it.

Outcomes may be binary (observed acceptance) or probabilities (analytic acceptance);
ECE and Brier take either, AUROC needs binary outcomes (probabilities are thresholded
at 0.5).
"""

from __future__ import annotations

import numpy as np
import torch

DEFAULT_BINS = 15


def _np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().double().cpu().numpy().reshape(-1)
    return np.asarray(x, dtype=np.float64).reshape(-1)


def reliability_bins(conf, outcome, num_bins: int = DEFAULT_BINS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Equal-width bins over [0, 1]: (mean confidence, mean outcome, count) per bin."""
    c, y = _np(conf), _np(outcome)
    idx = np.minimum((c * num_bins).astype(np.int64), num_bins - 1)
    counts = np.bincount(idx, minlength=num_bins).astype(np.float64)
    csum = np.bincount(idx, weights=c, minlength=num_bins)
    ysum = np.bincount(idx, weights=y, minlength=num_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return csum / counts, ysum / counts, counts


def ece(conf, outcome, num_bins: int = DEFAULT_BINS) -> float:
    """Expected calibration error: Σ_bins (n_b / n) |mean conf_b - mean outcome_b|."""
    mc, my, n = reliability_bins(conf, outcome, num_bins)
    total = n.sum()
    if total == 0:
        return float("nan")
    keep = n > 0
    return float((n[keep] / total * np.abs(mc[keep] - my[keep])).sum())


def brier(conf, outcome) -> float:
    c, y = _np(conf), _np(outcome)
    return float(np.mean((c - y) ** 2)) if c.size else float("nan")


def auroc(conf, outcome) -> float:
    """Area under the ROC curve (Mann-Whitney U with tied scores averaged); NaN when
    only one class occurs."""
    c, y = _np(conf), _np(outcome) >= 0.5
    pos, neg = int(y.sum()), int((~y).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(c, kind="mergesort")
    sorted_c = c[order]
    ranks = np.empty(c.size, dtype=np.float64)
    # average 1-based ranks over runs of equal scores
    _, start, counts = np.unique(sorted_c, return_index=True, return_counts=True)
    avg = start + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    return float((ranks[y].sum() - pos * (pos + 1) / 2) / (pos * neg))
