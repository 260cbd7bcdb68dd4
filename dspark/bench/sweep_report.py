"""What a sweep writes: sweep.json, sweep.md and the plots (`sweep_plots.py`).

sweep.md gives each point's median over rounds with its spread (min-max), and each
configuration against the reference as ratios taken within each round (paired),
their median and spread (`rounds.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

from .rounds import per_round, usable_point
from .sweep_plots import plot_sweep


def write_outputs(result: dict, out_dir: Path, plots: bool = True) -> None:
    out_dir = Path(out_dir)
    (out_dir / "sweep.json").write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    plotted = plot_sweep(result, out_dir) if plots else []
    (out_dir / "sweep.md").write_text(sweep_markdown(result, plotted))


def sweep_rounds(sweep: dict) -> int:
    """Measurements per point (sweeps written before rounds called them repeats)."""
    return sweep.get("rounds", sweep.get("repeats", 1))


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _with_spread(p: dict, key: str, digits: int = 1) -> str:
    text = _fmt(p.get(key), digits)
    if key in p.get("spread", {}):
        lo, hi = p["spread"][key]
        text += f" [{lo:.{digits}f}-{hi:.{digits}f}]"
    return text


def _repeat_line(repeats: str | None) -> str:
    if repeats is None:  # a sweep from before this was recorded, or several merged
        return ""
    if repeats == "none":
        return "No prompt is sent twice in the run (each point of each round has its own)."
    return (f"**Prompts repeat {repeats}** (the dataset was too small): a server that keeps recent "
            "prompts may meet some again.")


def sweep_markdown(result: dict, plots: list[str]) -> str:
    s = result["sweep"]
    load = s["load"]
    lines = ["# Serving sweep", "",
             f"Concurrency {', '.join(map(str, s['concurrencies']))}; {s['num_prompts']} prompts and "
             f"{s['num_warmups']} warm-ups per point. " + _method_line(s),
             f"Dataset `{load['dataset_path'] or load['dataset']}`, endpoint `{load['endpoint']}`, max tokens "
             f"{load['max_tokens']}, temperature {load['temperature']}, ignore_eos {load['ignore_eos']}. "
             + _repeat_line(s.get("prompt_repeats")),
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


def _method_line(s: dict) -> str:
    rounds = sweep_rounds(s)
    if "servers" not in s:  # written before rounds: every configuration in its turn, repeats back to back
        spread = " Figures: median [min-max] over repeats." if rounds > 1 else ""
        return (f"{rounds} repeat(s) per point, the configurations one after another (not interleaved: "
                f"drift of the machine between them is not cancelled).{spread}")
    spread = " Figures: median [min-max] over rounds." if rounds > 1 else ""
    servers = ("all servers up together" if s["servers"] == "together"
               else "each server started for its turn in every round")
    return (f"{rounds} round(s), {servers}: every round measures every point, the configurations taking "
            f"turns (round r starts at the (r mod n)-th), with new prompts each round, the same for every "
            f"configuration.{spread}")


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


def _ratio_text(r: dict | None) -> str:
    if r is None:
        return "-"
    if not r["paired"]:
        return f"{r['median']:.2f}*"
    if len(r["per_round"]) > 1:
        return f"{r['median']:.2f} [{r['spread'][0]:.2f}-{r['spread'][1]:.2f}]"
    return f"{r['median']:.2f}"


def _ratio_lines(result: dict) -> list[str]:
    rows = result.get("ratios") or []
    if not rows:
        return []
    ref = rows[0]["reference"]
    concs = sorted({r["concurrency"] for r in rows})
    paired = any(q["paired"] for r in rows for q in (r["output_throughput"], r["per_user_tps"]) if q)
    how = ("Each ratio is taken within a round, where both were measured minutes apart at most, then "
           "summarised over rounds: median [min-max]." if paired else "Ratios of the medians.")
    lines = ["", f"## Against {ref}", "",
             f"Aggregate output tok/s and per-user tok/s as multiples of {ref}'s at the same concurrency: "
             f"`aggregate x / per-user x`. {how}", "",
             "| configuration | " + " | ".join(f"c={c}" for c in concs) + " |", "|---|" + "---:|" * len(concs)]
    for name in dict.fromkeys(r["config"] for r in rows):
        mine = {r["concurrency"]: r for r in rows if r["config"] == name}
        cells = ["-" if c not in mine else
                 f"{_ratio_text(mine[c]['output_throughput'])} / {_ratio_text(mine[c]['per_user_tps'])}"
                 for c in concs]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if any(not q["paired"] for r in rows for q in (r["output_throughput"], r["per_user_tps"]) if q):
        lines += ["", "`*` not measured in the same sweep: the ratio of the medians, which the machine's drift "
                      "between the sweeps can fake; measure both in one sweep for a paired ratio."]
    return lines


def ab_summary(result: dict) -> str:
    """The paired comparison of `dspark bench ab`: per concurrency, each side's
    median output tok/s and the ratio with its spread over rounds."""
    rows = result.get("ratios") or []
    points = {(p["config"], p["concurrency"]): p for p in result["points"]}
    lines = []
    for r in rows:
        a, b = points[r["reference"], r["concurrency"]], points[r["config"], r["concurrency"]]
        out, user = r["output_throughput"], r["per_user_tps"]
        rounds = len(out["per_round"]) if out else 0
        lines.append(f"c={r['concurrency']}: {r['config']} / {r['reference']} = {_ratio_text(out)} output tok/s, "
                     f"{_ratio_text(user)} per-user tok/s (paired over {rounds} round(s); "
                     f"{r['reference']} {_with_spread(a, 'output_throughput')}, "
                     f"{r['config']} {_with_spread(b, 'output_throughput')} output tok/s)")
    return "\n".join(lines)


def dominance(result: dict, name: str, other: str) -> dict:
    """Whether `name`'s measured points cover every point of `other`: a point is
    covered when some point of `name` is at least as high in aggregate and per-user
    tok/s (medians: `strict`), or, `within_noise`, when some point of `name` was at
    least as high in both within one round (points of one sweep; a round's spread
    holds the machine's drift, so only a round compares like with like), or else
    when its best run reaches the other's median. Returns the uncovered
    concurrencies of each kind."""
    mine = [p for p in result["points"] if p["config"] == name and usable_point(p)]
    theirs = [p for p in result["points"] if p["config"] == other and usable_point(p)]
    strict, noisy = [], []
    for q in theirs:
        if not any(p["per_user_tps"] >= q["per_user_tps"] and p["output_throughput"] >= q["output_throughput"]
                   for p in mine):
            strict.append(q["concurrency"])
        if not any(_covers_within_noise(p, q) for p in mine):
            noisy.append(q["concurrency"])
    return {"strict": strict, "within_noise": noisy}


def _covers_within_noise(p: dict, q: dict) -> bool:
    keys = ("per_user_tps", "output_throughput")
    if p.get("sweep_id") is not None and p.get("sweep_id") == q.get("sweep_id"):
        mine, theirs = ({k: per_round(x, k) for k in keys} for x in (p, q))
        rounds = set(mine[keys[0]]) & set(mine[keys[1]]) & set(theirs[keys[0]]) & set(theirs[keys[1]])
        if rounds:
            return any(all(mine[k][r] >= theirs[k][r] for k in keys) for r in rounds)
    return all(p.get("spread", {}).get(k, [p[k], p[k]])[1] >= q[k] for k in keys)


def _dominance_lines(result: dict) -> list[str]:
    names = [c["name"] for c in result["configs"] if any(p["config"] == c["name"] and usable_point(p)
                                                         for p in result["points"])]
    if len(names) < 2:
        return []
    lines = ["", "## Frontier dominance", "",
             "A configuration dominates another when each of the other's points is matched or beaten in both "
             "aggregate and per-user tok/s by one of its own points (medians); *within noise*: in one round at "
             "least (a round's spread holds the machine's drift, so rounds are compared one by one). Listed: the "
             "other's points left uncovered (by concurrency).", "",
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
