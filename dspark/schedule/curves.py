"""Step-time curves as measured: made non-decreasing, their spikes found, isotonic fits,
and the interpolation every table reads (`dspark.schedule.step_time`)."""

from __future__ import annotations

import math

import numpy as np


def make_monotone(times_ms: list[float]) -> list[float]:
    """The running maximum of `times_ms`: the smallest non-decreasing curve that
    never lies below a measurement.

    Running max rather than isotonic regression because the two errors are not
    symmetric. The measurements are already medians, so what dips below an earlier
    count is mostly a kernel that happens to be fast at that exact shape; the engine
    runs whatever count the scheduler picks and does not pad to reach such a sweet
    spot, so trusting the dip would make the scheduler buy tokens at a price it will
    not get. Isotonic regression would also lower the measurements before the dip,
    promising speed nobody measured. Running max only ever rounds a cost up.
    """
    out: list[float] = []
    top = -math.inf
    for t in times_ms:
        top = max(top, float(t))
        out.append(top)
    return out


def spikes(raw_ms: list[float], tolerance: float = 0.10, ahead: int = 3) -> list[int]:
    """Indices of profile points that are probably stalls, not costs: more than
    `tolerance` above the median of the next `ahead` points. More tokens never cost
    less in a forward (a kernel's sweet spot is worth a few percent, not tens), so
    such a point is a step that waited for something else, which a median of five
    runs does not always remove on a busy or drifting machine. Left in, the running
    maximum (`make_monotone`) would carry it up to every larger count. The profiler
    measures these points again and keeps the lower median."""
    out = []
    for i in range(len(raw_ms) - 1):
        nxt = sorted(raw_ms[i + 1: i + 1 + ahead])
        if raw_ms[i] > (1.0 + tolerance) * nxt[(len(nxt) - 1) // 2]:
            out.append(i)
    return out


def isotonic(values, weights) -> np.ndarray:
    """The weighted least-squares non-decreasing fit of `values` (pool adjacent
    violators): a point observed once above a neighbour observed many times is
    pooled with it at their weighted mean, rather than lifting every later point as a
    running maximum would."""
    values = np.asarray(values, dtype=np.float64)
    if values.size < 2 or (values[1:] >= values[:-1]).all():
        return values.copy()  # already non-decreasing (the usual case): nothing to pool
    blocks: list[list[float]] = []  # [weighted sum, weight, points]
    for v, w in zip(values.tolist(), np.asarray(weights, dtype=np.float64).tolist()):
        blocks.append([v * w, w, 1])
        while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] > blocks[-1][0] * blocks[-2][1]:
            s, w2, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += w2
            blocks[-1][2] += n
    return np.concatenate([np.full(n, s / w) for s, w, n in blocks])


def _interp_ms(x: np.ndarray, counts: np.ndarray, times_ms: np.ndarray) -> np.ndarray:
    """Piecewise-linear through the measurements; flat below the first count, and
    beyond the last count continuing the slope of the last segment (flat when only
    one count was measured), so tokens past the profiled range never look free."""
    y = np.interp(x, counts, times_ms)
    if counts.size >= 2:
        slope = (times_ms[-1] - times_ms[-2]) / (counts[-1] - counts[-2])
        beyond = x > counts[-1]
        y = np.where(beyond, times_ms[-1] + slope * (x - counts[-1]), y)
    return y


def _memo_interp(table, n: int) -> float:
    """`table`'s time in seconds at the integer count `n`, remembered until its times
    change (every replacement of `table._ms` is a new array): the engine asks for the
    same few counts every step, and a numpy interpolation of one value costs tens of
    microseconds."""
    memo = getattr(table, "_memo", None)
    if memo is None or memo[0] is not table._ms:
        memo = table._memo = (table._ms, {})
    t = memo[1].get(n)
    if t is None:
        t = memo[1][n] = float(_interp_ms(np.float64(n), table._counts, table._ms)) / 1000.0
    return t
