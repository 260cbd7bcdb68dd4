"""What a sweep writes: sweep.json, sweep.md and two plots.

- `pareto.png`: aggregate output tok/s against per-user tok/s, one curve per
  configuration, each point labelled with its concurrency; tiers within reach of
  the data as dashed lines.
- `throughput_vs_concurrency.png`: output tok/s against concurrency.
With repeats, bars show each point's spread (min to max).
"""

from __future__ import annotations

import json
from pathlib import Path

PARETO_PNG = "pareto.png"
CONCURRENCY_PNG = "throughput_vs_concurrency.png"


def write_outputs(result: dict, out_dir: Path) -> None:
    out_dir = Path(out_dir)
    (out_dir / "sweep.json").write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    plotted = plot_sweep(result, out_dir)
    (out_dir / "sweep.md").write_text(sweep_markdown(result, plotted))


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _with_spread(p: dict, key: str, digits: int = 1) -> str:
    text = _fmt(p.get(key), digits)
    if key in p.get("spread", {}):
        lo, hi = p["spread"][key]
        text += f" [{lo:.{digits}f}-{hi:.{digits}f}]"
    return text


def sweep_markdown(result: dict, plots: list[str]) -> str:
    s = result["sweep"]
    load = s["load"]
    lines = ["# Serving sweep", "",
             f"Concurrency {', '.join(map(str, s['concurrencies']))}; {s['num_prompts']} prompts and "
             f"{s['num_warmups']} warm-ups per point; {s['repeats']} repeat(s) per point"
             + (" (median [min-max])" if s["repeats"] > 1 else "") + ".",
             f"Dataset `{load['dataset_path'] or load['dataset']}`, endpoint `{load['endpoint']}`, max tokens "
             f"{load['max_tokens']}, temperature {load['temperature']}, ignore_eos {load['ignore_eos']}.",
             "Per-user tok/s is the median over requests of 1/TPOT, TPOT = (E2EL - TTFT) / (output tokens - 1); "
             "ITL is per streamed chunk (a speculative server sends several tokens per chunk). "
             "Acceptance length = accepted draft tokens / drafts + 1, from the server's /metrics.", "",
             "## Configurations", "",
             "| configuration | server | status | start-up (s) |", "|---|---|---|---|"]
    for c in result["configs"]:
        server = (json.dumps(c["speculative_config"]) if c["kind"] == "dspark" and c["speculative_config"]
                  else "no speculation" if c["kind"] == "dspark" else c.get(c["kind"], ""))
        server = server.replace("|", "\\|")  # a shell pipe would end the table cell
        lines.append(f"| {c['name']} | `{server}` | {c['status']} | {_fmt(c['startup_s'])} |")
    lines += ["", "## Points", ""]
    if not result["points"]:
        lines.append("No point was measured.")
    else:
        lines += _point_lines(result["points"])
    lines += _tier_lines(result)
    lines += _ratio_lines(result)
    lines += _dominance_lines(result)
    failed = [c for c in result["configs"] if c["status"] != "ok"]
    if failed:
        lines += ["", "## Failed configurations", ""]
        for c in failed:
            lines += [f"### {c['name']}", "", "```", c["error"] or "", "```", ""]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{name}]({name})" for name in plots]
    return "\n".join(lines).rstrip() + "\n"


def _point_lines(points: list[dict]) -> list[str]:
    lines = ["| configuration | concurrency | req/s | output tok/s | per-user tok/s | TTFT median (ms) | "
             "TPOT median (ms) | ITL median (ms) | acceptance length | tokens/chunk | failed | Pareto |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    for p in points:
        lines.append(
            f"| {p['config']} | {p['concurrency']} | {_with_spread(p, 'request_throughput', 2)} | "
            f"{_with_spread(p, 'output_throughput')} | {_with_spread(p, 'per_user_tps')} | "
            f"{_with_spread(p, 'ttft_ms')} | {_with_spread(p, 'tpot_ms')} | {_with_spread(p, 'itl_ms')} | "
            f"{_with_spread(p, 'acceptance_length', 2)} | {_fmt(p['mean_tokens_per_chunk'], 2)} | "
            f"{_fmt(p['failed'], 0)} | {'yes' if p['pareto'] else ''} |")
    return lines


def _tier_lines(result: dict) -> list[str]:
    tiers = result["tiers"]
    if not tiers:
        return []
    names = [c["name"] for c in result["configs"]]
    status = {c["name"]: c["status"] for c in result["configs"]}
    lines = ["", "## SLA tiers", "",
             "Best output tok/s each configuration sustains with per-user tok/s at or above the tier "
             "(at concurrency c); `-` = the tier is out of its reach.", "",
             "| per-user tok/s >= | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]
    for row in tiers:
        cells = []
        for name in names:
            best = row["best"].get(name)
            cells.append("failed" if status[name] != "ok" and best is None else
                         "-" if best is None else f"{best['output_throughput']:.1f} (c={best['concurrency']})")
        lines.append(f"| {row['tier']:g} | " + " | ".join(cells) + " |")
    lines.append("")
    for name in names:
        if status[name] != "ok":
            continue
        missed = [f"{row['tier']:g}" for row in tiers if row["best"].get(name) is None]
        if missed:
            fastest = max((p["per_user_tps"] for p in result["points"]
                           if p["config"] == name and p["per_user_tps"] is not None), default=None)
            lines.append(f"- {name} cannot reach {', '.join(missed)} tok/s per user "
                         f"(its fastest point: {_fmt(fastest)} tok/s per user).")
    return lines


def reference_name(result: dict) -> str | None:
    """The configuration others are compared with: the sweep's `reference`, else
    `none` when measured, else the first configuration."""
    names = [c["name"] for c in result["configs"]]
    ref = result["sweep"].get("reference")
    if ref in names:
        return ref
    return "none" if "none" in names else (names[0] if names else None)


def _ratio_lines(result: dict) -> list[str]:
    ref = reference_name(result)
    points = [p for p in result["points"] if usable_point(p)]
    base = {p["concurrency"]: p for p in points if p["config"] == ref}
    if not base or len({p["config"] for p in points}) < 2:
        return []
    concs = sorted(base)
    lines = ["", f"## Against {ref}", "",
             f"Aggregate output tok/s and per-user tok/s as multiples of {ref}'s at the same concurrency "
             "(medians over repeats): `aggregate x / per-user x`.", "",
             "| configuration | " + " | ".join(f"c={c}" for c in concs) + " |", "|---|" + "---:|" * len(concs)]
    for name in [c["name"] for c in result["configs"] if c["name"] != ref]:
        mine = {p["concurrency"]: p for p in points if p["config"] == name}
        if not mine:
            continue
        cells = []
        for c in concs:
            p, b = mine.get(c), base[c]
            cells.append("-" if p is None else f"{p['output_throughput'] / b['output_throughput']:.2f} / "
                                                f"{p['per_user_tps'] / b['per_user_tps']:.2f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def dominance(result: dict, name: str, other: str) -> dict:
    """Whether `name`'s measured points cover every point of `other`: a point is
    covered when some point of `name` is at least as high in aggregate and per-user
    tok/s (medians: `strict`), or when its best repeat reaches the other's median
    (`within_noise`). Returns the uncovered concurrencies of each kind."""
    mine = [p for p in result["points"] if p["config"] == name and usable_point(p)]
    theirs = [p for p in result["points"] if p["config"] == other and usable_point(p)]

    def top(p: dict, key: str) -> float:
        return p.get("spread", {}).get(key, [p[key], p[key]])[1]

    strict, noisy = [], []
    for q in theirs:
        if not any(p["per_user_tps"] >= q["per_user_tps"] and p["output_throughput"] >= q["output_throughput"]
                   for p in mine):
            strict.append(q["concurrency"])
        if not any(top(p, "per_user_tps") >= q["per_user_tps"] and top(p, "output_throughput") >= q["output_throughput"]
                   for p in mine):
            noisy.append(q["concurrency"])
    return {"strict": strict, "within_noise": noisy}


def _dominance_lines(result: dict) -> list[str]:
    names = [c["name"] for c in result["configs"] if any(p["config"] == c["name"] and usable_point(p)
                                                         for p in result["points"])]
    if len(names) < 2:
        return []
    lines = ["", "## Frontier dominance", "",
             "A configuration dominates another when each of the other's points is matched or beaten in both "
             "aggregate and per-user tok/s by one of its own points (medians); *within noise* lets its best "
             "repeat stand in for its median. Listed: the other's points left uncovered (by concurrency).", "",
             "| configuration | dominates | dominates within noise | does not dominate |", "|---|---|---|---|"]
    for name in names:
        full, noisy, no = [], [], []
        for other in names:
            if other == name:
                continue
            d = dominance(result, name, other)
            if not d["strict"]:
                full.append(other)
            elif not d["within_noise"]:
                noisy.append(other)
            else:
                no.append(f"{other} (c={','.join(map(str, d['within_noise']))})")
        lines.append(f"| {name} | {', '.join(full) or '-'} | {', '.join(noisy) or '-'} | {', '.join(no) or '-'} |")
    return lines


def usable_point(p: dict) -> bool:
    """A point with both figures of the frontier (a failed point has neither)."""
    return p.get("per_user_tps") is not None and p.get("output_throughput") is not None


def plot_sweep(result: dict, out_dir: Path) -> list[str]:
    """Write the two plots; returns their file names (none when there is nothing to plot)."""
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
    _finish(plt, fig, ax, out_dir / PARETO_PNG, "per-user tok/s (median of 1/TPOT)", "Throughput against per-user speed")

    fig, ax = plt.subplots(figsize=(7, 5))
    for name in names:
        mine = sorted((p for p in points if p["config"] == name), key=lambda p: p["concurrency"])
        ax.errorbar([p["concurrency"] for p in mine], [p["output_throughput"] for p in mine],
                    yerr=_bars(mine, "output_throughput"), marker="o", label=name, capsize=3)
    ax.set_xscale("log", base=2)
    _finish(plt, fig, ax, out_dir / CONCURRENCY_PNG, "concurrency (requests in flight)", "Throughput against concurrency")
    return [PARETO_PNG, CONCURRENCY_PNG]


def _finish(plt, fig, ax, path: Path, xlabel: str, title: str) -> None:
    """Common finish of both plots (aggregate tok/s on y from 0), saved and closed."""
    ax.set_ylim(bottom=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("aggregate output tok/s")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _bars(points: list[dict], key: str) -> list[list[float]] | None:
    """Asymmetric error bars (below, above) from each point's spread; None without repeats."""
    if not any(key in p["spread"] for p in points):
        return None
    lo = [p[key] - p["spread"].get(key, [p[key], p[key]])[0] for p in points]
    hi = [p["spread"].get(key, [p[key], p[key]])[1] - p[key] for p in points]
    return [lo, hi]
