"""The figures a benchmark reports, computed from per-request timings.

Definitions (times are from the moment the request is sent; a request waiting for
a free slot under `--max-concurrency` is not yet sent):

- **TTFT**: until the first streamed chunk that carries output text.
- **E2EL**: until the end of the stream.
- **TPOT** of a request: `(E2EL - TTFT) / (output_tokens - 1)`, the time per output
  token after the first. It does not depend on how the server groups tokens into
  chunks, so it is the figure to compare across speculative configurations.
  Requests with fewer than two output tokens have no TPOT.
- **ITL**: one sample per chunk after the first text chunk: the gap since the
  previous text chunk. A speculative server sends several tokens in one chunk, so
  ITL is the wait between visible updates, not per token; its mean is about
  `TPOT x tokens per chunk` (`mean_tokens_per_chunk` in the report).
- **Per-user tok/s** of a request: `(output_tokens - 1) / (E2EL - TTFT)`, i.e.
  `1 / TPOT`, the decode speed one user sees once text has started. Reported as
  mean and median over requests (the median is what sweep tiers use).
- **Goodput**: completed requests that meet every given SLO (TTFT, TPOT, E2EL in
  ms) per second of benchmark duration. A request without TPOT meets a TPOT SLO.

Percentiles interpolate linearly between closest ranks (numpy's default method).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

GOODPUT_KEYS = ("ttft", "tpot", "e2el")


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0 <= p <= 100) with linear interpolation; NaN when empty."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {p}")
    if not values:
        return math.nan
    xs = sorted(values)
    rank = p / 100 * (len(xs) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def summarize(values: Sequence[float], percentiles: Sequence[float] = (99,)) -> dict[str, float | None]:
    """mean, median, std (population), min, max and `p<P>` for each percentile;
    every figure None when there are no values."""
    keys = ["mean", "median", "std", "min", "max", *(percentile_key(p) for p in percentiles)]
    if not values:
        return dict.fromkeys(keys)
    n = len(values)
    mean = sum(values) / n
    out = {"mean": mean, "median": percentile(values, 50),
           "std": math.sqrt(sum((v - mean) ** 2 for v in values) / n), "min": min(values), "max": max(values)}
    out.update({percentile_key(p): percentile(values, p) for p in percentiles})
    return out


def percentile_key(p: float) -> str:
    return f"p{p:g}"


@dataclass
class RequestTiming:
    """What the statistics need from one completed request (seconds)."""

    ttft: float
    e2el: float
    output_tokens: int
    itls: list[float]

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)

    @property
    def user_tps(self) -> float | None:
        tpot = self.tpot
        return None if tpot is None or tpot <= 0 else 1.0 / tpot


def parse_goodput(items: Sequence[str]) -> dict[str, float]:
    """`["ttft:500", "tpot:50"]` -> `{"ttft": 500.0, "tpot": 50.0}` (milliseconds)."""
    slo: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition(":")
        key = key.strip().lower()
        if not sep or key not in GOODPUT_KEYS:
            raise ValueError(f"goodput SLO {item!r} is not KEY:MS with KEY one of {', '.join(GOODPUT_KEYS)}")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"goodput SLO {item!r}: {value!r} is not a number of milliseconds") from None
        if not ms > 0 or math.isinf(ms):
            raise ValueError(f"goodput SLO {item!r}: the limit must be a positive number of milliseconds")
        slo[key] = ms
    return slo


def meets_slo(t: RequestTiming, slo: dict[str, float]) -> bool:
    if "ttft" in slo and t.ttft * 1e3 > slo["ttft"]:
        return False
    if "e2el" in slo and t.e2el * 1e3 > slo["e2el"]:
        return False
    tpot = t.tpot
    return not ("tpot" in slo and tpot is not None and tpot * 1e3 > slo["tpot"])


def latency_figures(timings: Sequence[RequestTiming], duration: float, percentiles: Sequence[float] = (99,),
                    slo: dict[str, float] | None = None) -> dict:
    """The latency and speed figures of completed requests over a run of `duration` seconds."""
    ms = 1e3
    tpots = [t.tpot for t in timings if t.tpot is not None]
    user = [t.user_tps for t in timings if t.user_tps is not None]
    out = {
        "ttft_ms": summarize([t.ttft * ms for t in timings], percentiles),
        "tpot_ms": summarize([x * ms for x in tpots], percentiles),
        "itl_ms": summarize([x * ms for t in timings for x in t.itls], percentiles),
        "e2el_ms": summarize([t.e2el * ms for t in timings], percentiles),
        "per_user_tps": summarize(user, percentiles),
        "goodput": None,
    }
    if slo:
        good = sum(meets_slo(t, slo) for t in timings)
        out["goodput"] = {"slo_ms": dict(slo), "good_requests": good,
                          "request_goodput": good / duration if duration > 0 else None}
    return out
