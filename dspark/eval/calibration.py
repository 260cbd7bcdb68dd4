"""The reliability diagram of confidence estimates, drawn from the calibration metrics
of `dspark.calibration`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dspark.calibration import DEFAULT_BINS, ece, reliability_bins


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
