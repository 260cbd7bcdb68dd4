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


def lengths_from(rows_in_order: np.ndarray, num_admitted: int, num_requests: int) -> list[int]:
    return np.bincount(rows_in_order[:num_admitted], minlength=num_requests).tolist()
