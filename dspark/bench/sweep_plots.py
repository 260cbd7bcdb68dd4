"""The plots of a sweep, each point at its median over rounds with its spread
(min to max) as error bars:

- `pareto.png`: aggregate output tok/s against per-user tok/s, one curve per
  configuration, each point labelled with its concurrency; tiers within reach of
  the data as dashed lines.
- `throughput_vs_concurrency.png`: output tok/s against concurrency.
- `ratios.png`: each configuration's output tok/s as a multiple of the reference's
  against concurrency, the median of the per-round (paired) ratios with their
  spread; a ratio of points from separate sweeps (unpaired) is a hollow marker.
"""

from __future__ import annotations

from pathlib import Path

from .rounds import usable_point

PARETO_PNG = "pareto.png"
CONCURRENCY_PNG = "throughput_vs_concurrency.png"
RATIOS_PNG = "ratios.png"


def plot_sweep(result: dict, out_dir: Path) -> list[str]:
    """Write the plots; returns their file names (none when there is nothing to plot)."""
    points = [p for p in result["points"] if usable_point(p)]
    if not points:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [c["name"] for c in result["configs"] if any(p["config"] == c["name"] for p in points)]
    fig, ax = plt.subplots(figsize=(7, 5))
    for name in names:
        mine = sorted((p for p in points if p["config"] == name), key=lambda p: p["concurrency"])
        xs, ys = [p["per_user_tps"] for p in mine], [p["output_throughput"] for p in mine]
        line = ax.errorbar(xs, ys, xerr=_bars(mine, "per_user_tps"), yerr=_bars(mine, "output_throughput"),
                           marker="o", label=name, capsize=3)
        for p, x, y in zip(mine, xs, ys):
            ax.annotate(f"c={p['concurrency']}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8,
                        color=line[0].get_color())
    reach = 1.25 * max(p["per_user_tps"] for p in points)
    for tier in result["sweep"]["tiers"]:
        if tier <= reach:  # a far-off tier would squash every curve against the axis
            ax.axvline(tier, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    _finish(plt, fig, ax, out_dir / PARETO_PNG, "per-user tok/s (median of 1/TPOT)", "aggregate output tok/s",
            "Throughput against per-user speed")

    fig, ax = plt.subplots(figsize=(7, 5))
    for name in names:
        mine = sorted((p for p in points if p["config"] == name), key=lambda p: p["concurrency"])
        ax.errorbar([p["concurrency"] for p in mine], [p["output_throughput"] for p in mine],
                    yerr=_bars(mine, "output_throughput"), marker="o", label=name, capsize=3)
    _concurrency_axis(ax, [p["concurrency"] for p in points])
    ax.set_ylim(bottom=0)
    _finish(plt, fig, ax, out_dir / CONCURRENCY_PNG, "concurrency (requests in flight)", "aggregate output tok/s",
            "Throughput against concurrency")
    written = [PARETO_PNG, CONCURRENCY_PNG]
    if _plot_ratios(plt, result, out_dir / RATIOS_PNG):
        written.append(RATIOS_PNG)
    return written


def _plot_ratios(plt, result: dict, path: Path) -> bool:
    rows = [r for r in result.get("ratios", []) if r.get("output_throughput")]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(7, 5))
    for name in dict.fromkeys(r["config"] for r in rows):
        mine = sorted((r for r in rows if r["config"] == name), key=lambda r: r["concurrency"])
        xs = [r["concurrency"] for r in mine]
        ratios = [r["output_throughput"] for r in mine]
        ys = [q["median"] for q in ratios]
        below = [q["median"] - q["spread"][0] if q["spread"] else 0.0 for q in ratios]
        above = [q["spread"][1] - q["median"] if q["spread"] else 0.0 for q in ratios]
        line = ax.errorbar(xs, ys, yerr=[below, above], marker="o", label=name, capsize=3)
        unpaired = [(x, y) for x, y, q in zip(xs, ys, ratios) if not q["paired"]]
        if unpaired:
            ax.plot(*zip(*unpaired), "o", markersize=10, markerfacecolor="white",
                    markeredgecolor=line[0].get_color())
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
    _concurrency_axis(ax, [r["concurrency"] for r in rows])
    ref = rows[0]["reference"]
    _finish(plt, fig, ax, path, "concurrency (requests in flight)", f"output tok/s / {ref}'s",
            f"Against {ref}: per-round ratios, median and min-max")
    return True


def _concurrency_axis(ax, concurrencies: list[int]) -> None:
    """Log-2 spacing, labelled with the concurrencies measured (not powers of two)."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(concurrencies))
    ax.set_xticks(ticks, [str(c) for c in ticks])
    ax.minorticks_off()


def _finish(plt, fig, ax, path: Path, xlabel: str, ylabel: str, title: str) -> None:
    """Common finish of every plot, saved and closed."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _bars(points: list[dict], key: str) -> list[list[float]] | None:
    """Asymmetric error bars (below, above) from each point's spread; None with one round."""
    if not any(key in p["spread"] for p in points):
        return None
    lo = [p[key] - p["spread"].get(key, [p[key], p[key]])[0] for p in points]
    hi = [p["spread"].get(key, [p[key], p[key]])[1] - p[key] for p in points]
    return [lo, hi]
