"""Measurements over rounds: the order configurations take turns in, one point's
median and spread over its rounds, and ratios paired round by round.

A shared machine's speed drifts (other tenants, clocks, caches) by tens of percent
over minutes, so two configurations measured one after another differ by the drift
as much as by themselves. A sweep therefore measures in rounds: in every round each
configuration is measured at every point, the configurations taking turns, and round
r starts at configuration r mod n (A B, B A, A B, ...), so no configuration is always
measured first. A ratio between two configurations is taken within each round, where
both saw about the same machine, and summarised by its median over rounds and its
spread (min, max); a ratio of medians over rounds would let drift back in.
"""

from __future__ import annotations

from dataclasses import dataclass

# point figures that get a median and spread over rounds: key -> path in a run's result
POINT_FIGURES: dict[str, tuple[str, ...]] = {
    "request_throughput": ("request_throughput",),
    "output_throughput": ("output_throughput",),
    "total_token_throughput": ("total_token_throughput",),
    "per_user_tps": ("per_user_tps", "median"),
    "per_user_tps_mean": ("per_user_tps", "mean"),
    "ttft_ms": ("ttft_ms", "median"),
    "ttft_ms_p99": ("ttft_ms", "p99"),
    "tpot_ms": ("tpot_ms", "median"),
    "tpot_ms_p99": ("tpot_ms", "p99"),
    "itl_ms": ("itl_ms", "median"),
    "itl_ms_p99": ("itl_ms", "p99"),
    "e2el_ms": ("e2el_ms", "median"),
    "acceptance_length": ("spec_decode", "acceptance_length"),
    "mean_tokens_per_chunk": ("mean_tokens_per_chunk",),
    "failed": ("failed",),
}
#: the figures compared between configurations (the two axes of the frontier)
RATIO_FIGURES: tuple[str, ...] = ("output_throughput", "per_user_tps")


@dataclass(frozen=True)
class Visit:
    """One measurement of a sweep: a configuration at a concurrency in a round."""

    round: int
    config: str
    concurrency: int


def round_order(names: list[str], round_index: int) -> list[str]:
    """The configurations in the order round `round_index` measures them: the given
    order, rotated to start at configuration `round_index` mod n."""
    if not names:
        return []
    k = round_index % len(names)
    return names[k:] + names[:k]


def round_visits(names: list[str], concurrencies: list[int], round_index: int, together: bool) -> list[Visit]:
    """Every point of one round. With all servers up (`together`), the configurations
    alternate at each concurrency, so the two sides of a ratio are measured minutes
    apart at most; with one server up at a time, each configuration runs all its
    concurrencies in its turn (a server start per turn, not per point)."""
    order = round_order(names, round_index)
    if together:
        return [Visit(round_index, name, c) for c in concurrencies for name in order]
    return [Visit(round_index, name, c) for name in order for c in concurrencies]


def median(xs: list[float]) -> float:
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def figure(run: dict, path: tuple[str, ...]) -> float | None:
    """The number at `path` in a run's result, None when absent (e.g. no acceptance
    from a server without speculation)."""
    value: object = run
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def aggregate_runs(name: str, concurrency: int, runs: list[dict], sweep_id: str | None = None) -> dict:
    """One sweep point from its runs (one per round): the median of each figure over
    the runs that have it, and the (min, max) spread."""
    point: dict = {"config": name, "concurrency": concurrency, "rounds": len(runs),
                   "num_prompts": runs[0]["config"]["num_prompts"], "sweep_id": sweep_id}
    spread = {}
    for key, path in POINT_FIGURES.items():
        xs = [x for x in (figure(r, path) for r in runs) if x is not None]
        point[key] = median(xs) if xs else None
        if len(xs) > 1:
            spread[key] = [min(xs), max(xs)]
    point["spread"] = spread
    point["pareto"] = False
    point["runs"] = runs
    return point


def usable_point(p: dict) -> bool:
    """A point with both figures of the frontier (a failed point has neither)."""
    return p.get("per_user_tps") is not None and p.get("output_throughput") is not None


def per_round(point: dict, key: str) -> dict[int, float]:
    """Round -> the point's figure `key` in that round (positive figures only)."""
    path = POINT_FIGURES[key]
    return {r["round"]: x for r in point.get("runs", [])
            if isinstance(r.get("round"), int) and (x := figure(r, path)) is not None and x > 0}


def paired_ratio(point: dict, base: dict, key: str) -> dict | None:
    """`point`'s figure `key` as a multiple of `base`'s. Paired when both were measured
    in the same sweep: one ratio per round both have, their median and (min, max).
    Otherwise (points of separate sweeps, or without rounds) the ratio of the medians,
    which drift between the sweeps can fake: `paired` is False and there is no spread."""
    if point.get(key) is None or not base.get(key):
        return None
    if point.get("sweep_id") is not None and point.get("sweep_id") == base.get("sweep_id"):
        mine, theirs = per_round(point, key), per_round(base, key)
        rounds = sorted(set(mine) & set(theirs))
        if rounds:
            ratios = [mine[r] / theirs[r] for r in rounds]
            return {"median": median(ratios), "spread": [min(ratios), max(ratios)], "per_round": ratios,
                    "rounds": rounds, "paired": True}
    return {"median": point[key] / base[key], "spread": None, "per_round": [], "rounds": [], "paired": False}


def ratio_table(points: list[dict], reference: str) -> list[dict]:
    """Every other configuration's points against `reference`'s at the same
    concurrency: one row per (configuration, concurrency) with a `paired_ratio` per
    figure of RATIO_FIGURES."""
    base = {p["concurrency"]: p for p in points if p["config"] == reference}
    rows = []
    for p in points:
        b = base.get(p["concurrency"])
        if p["config"] == reference or b is None:
            continue
        ratios = {key: paired_ratio(p, b, key) for key in RATIO_FIGURES}
        if any(v is not None for v in ratios.values()):
            rows.append({"config": p["config"], "reference": reference, "concurrency": p["concurrency"], **ratios})
    return rows
