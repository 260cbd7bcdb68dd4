"""Survival matrices: the scheduler's input checked, and the order in which the
table-priced policies admit drafted tokens (see `dspark.schedule.policies` for the
glossary)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

SurvivalLike = torch.Tensor | np.ndarray | Sequence[Sequence[float]]


def as_survival(survival: SurvivalLike) -> np.ndarray:
    """`survival` as a float64 [R, G] array, checked to be probabilities that do not
    increase along each row (the prefix property the policies rely on)."""
    if isinstance(survival, torch.Tensor):
        s = survival.detach().to(device="cpu", dtype=torch.float64).numpy()
    else:
        s = np.asarray(survival, dtype=np.float64)
    if s.ndim != 2:
        raise ValueError(f"survival must have shape [requests, drafted tokens], got {s.shape}")
    if s.size:
        if not np.isfinite(s).all() or s.min() < 0.0 or s.max() > 1.0:
            raise ValueError("survival must hold probabilities in [0, 1]")
        if s.shape[1] > 1 and (s[:, 1:] > s[:, :-1]).any():
            raise ValueError(
                "survival must be non-increasing along each row (s_k = c_1 * ... * c_k); "
                "pass cumulative products, not per-token confidences"
            )
    return s


def shape_of(survival: SurvivalLike) -> tuple[int, int]:
    shape = tuple(survival.shape) if hasattr(survival, "shape") else np.shape(survival)
    if len(shape) != 2:
        raise ValueError(f"survival must have shape [requests, drafted tokens], got {shape}")
    return int(shape[0]), int(shape[1])


def admission_order(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All (i, k) sorted by survival, highest first, lower k first on ties, so that
    every prefix of the order is a set of per-request prefixes. Returns the request
    index and survival of each entry, in that order."""
    num_requests, num_drafted = s.shape  # [R, G]
    flat = s.reshape(-1)  # [R*G], row-major
    position = np.tile(np.arange(num_drafted), num_requests)  # [R*G]
    order = np.lexsort((position, -flat))  # [R*G]; the last key is the primary one
    return order // num_drafted, flat[order]


#: survival tables up to this many entries are ordered in plain Python: the engine prices
#: one every step right after a forward, where numpy's per-call cost (tens of
#: microseconds a call on a few dozen numbers) was most of the pricing's time
SMALL_TABLE = 64


def small_survival_rows(survival: SurvivalLike) -> list[list[float]] | None:
    """`survival` as checked rows of Python floats when it holds at most SMALL_TABLE
    entries (the checks of `as_survival`), else None."""
    r, g = shape_of(survival)
    if r * g > SMALL_TABLE:
        return None
    rows = survival.detach().to("cpu", torch.float64).tolist() if isinstance(survival, torch.Tensor) else \
        [[float(v) for v in row] for row in survival]
    for row in rows:
        for k, v in enumerate(row):
            if not 0.0 <= v <= 1.0:  # NaN and infinities fail too
                raise ValueError("survival must hold probabilities in [0, 1]")
            if k and v > row[k - 1]:
                raise ValueError(
                    "survival must be non-increasing along each row (s_k = c_1 * ... * c_k); "
                    "pass cumulative products, not per-token confidences"
                )
    return rows


def admission_order_rows(rows: list[list[float]]) -> tuple[list[int], list[float]]:
    """`admission_order` of Python rows: the same order (highest survival first, lower
    k, then lower request, first on ties)."""
    entries = sorted((-v, k, i) for i, row in enumerate(rows) for k, v in enumerate(row))
    return [i for _, _, i in entries], [-v for v, _, _ in entries]


def lengths_from(rows_in_order: np.ndarray, num_admitted: int, num_requests: int) -> list[int]:
    return np.bincount(rows_in_order[:num_admitted], minlength=num_requests).tolist()


def lengths_from_rows(rows_in_order: list[int], num_admitted: int, num_requests: int) -> list[int]:
    """`lengths_from` of `admission_order_rows`' plain-Python order."""
    lengths = [0] * num_requests
    for i in rows_in_order[:num_admitted]:
        lengths[i] += 1
    return lengths
