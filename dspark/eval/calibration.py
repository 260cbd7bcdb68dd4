"""Calibration metrics of confidence estimates: ECE, Brier score, AUROC and the
reliability diagram. Pure functions of (confidence, outcome) arrays.

Outcomes may be binary (observed acceptance) or probabilities (analytic acceptance);
ECE and Brier take either, AUROC needs binary outcomes (probabilities are thresholded
at 0.5).
"""

from __future__ import annotations

from pathlib import Path

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


def reliability_diagram(
    path: str | Path,
    curves: dict[str, tuple[np.ndarray, np.ndarray]],  # label -> (confidence, outcome)
    per_position_ece: dict[str, list[float]] | None = None,
    title: str = "",
    num_bins: int = DEFAULT_BINS,
) -> Path:
    """Write a PNG: observed vs predicted per confidence bin for each curve, and (if
    given) ECE per drafted position."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = 2 if per_position_ece else 1
    fig, axes = plt.subplots(1, ncols, figsize=(5.5 * ncols, 4.6), squeeze=False)
    ax = axes[0][0]
    ax.plot([0, 1], [0, 1], ls="--", color="grey", lw=1, label="perfect")
    for label, (c, y) in curves.items():
        mc, my, n = reliability_bins(c, y, num_bins)
        keep = n > 0
        ax.plot(mc[keep], my[keep], marker="o", ms=4, label=f"{label} (ECE {ece(c, y, num_bins):.3f})")
    ax.set_xlabel("predicted survival c_1...c_k")
    ax.set_ylabel("observed prefix acceptance")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title(title or "reliability")
    if per_position_ece:
        ax2 = axes[0][1]
        width = 0.8 / len(per_position_ece)
        for i, (label, vals) in enumerate(per_position_ece.items()):
            xs = np.arange(1, len(vals) + 1) + (i - (len(per_position_ece) - 1) / 2) * width
            ax2.bar(xs, vals, width=width, label=label)
        ax2.set_xlabel("drafted position k")
        ax2.set_ylabel("ECE of survival")
        ax2.legend(fontsize=8)
        ax2.set_title("ECE per position")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
