"""Verification lengths for prompt lookup's proposals, which cost no drafter time: the
best admission prefix priced on the target's step time alone (see
`dspark.schedule.policies` for the glossary and the policies that price drafts)."""

from __future__ import annotations

import numpy as np

from .step_time import StepTimeTable
from .survival import SurvivalLike, admission_order, admission_order_rows, as_survival, lengths_from, \
    lengths_from_rows, small_survival_rows


def free_lengths(survival: SurvivalLike, table: StepTimeTable, others: int = 0, other_tokens: int = 0) -> list[int]:
    """Verification lengths for proposals that cost no drafter time and are a
    deterministic function of the context (prompt lookup): the admission prefix that
    maximises expected tokens per second of target time,

        (R + sum of admitted s_{i,k}) / target_time(R + B),

    over the WHOLE table (R counting `others` too, and the time `other_tokens`: see
    `VerifyLengthPolicy`). No token of such a proposal was sampled, so nothing can leak
    from a later entry into an earlier one's admission: the best prefix is lossless
    here, where for sampled drafts only the first drop (`DSparkSync`) or a lagged
    budget (`DSparkAsync`) is."""
    small = small_survival_rows(survival)
    if small is not None:
        return _free_lengths_small(small, table, others, other_tokens)
    return _free_lengths_array(as_survival(survival), table, others, other_tokens)


def _free_lengths_array(s: np.ndarray, table: StepTimeTable, others: int, other_tokens: int) -> list[int]:
    num_requests, num_drafted = s.shape
    if num_requests == 0 or num_drafted == 0:
        return [0] * num_requests
    rows, gains = admission_order(s)
    expected = num_requests + others + np.concatenate(([0.0], np.cumsum(gains)))  # [R*G+1]
    times = table.admission_times(num_requests + others + other_tokens + np.arange(gains.size + 1), num_requests,
                                  drafted=False, others=others, other_tokens=other_tokens)
    return lengths_from(rows, int((expected / times).argmax()), num_requests)


def _free_lengths_small(s: list[list[float]], table: StepTimeTable, others: int, other_tokens: int) -> list[int]:
    """`free_lengths` of a small table in plain Python: the same sums in the same order
    and the same times, so the same lengths."""
    if len(s) == 0 or not s[0]:
        return [0] * len(s)
    rows, best, _ = _best_prefix_rows(s, table, False, others, other_tokens)
    return lengths_from_rows(rows, best, len(s))


def best_rate(s: list[list[float]], table: StepTimeTable, drafted: bool, others: int = 0,
              other_tokens: int = 0) -> float:
    """Expected tokens per second of the best admission prefix of survivals `s` (Python
    rows), the drafter's time included when `drafted`: what a step would make of these
    proposals. Compares a drafting step with a lookup-only one before either is made."""
    return _best_prefix_rows(s, table, drafted, others, other_tokens)[2]


def _best_prefix_rows(s: list[list[float]], table: StepTimeTable, drafted: bool, others: int,
                      other_tokens: int) -> tuple[list[int], int, float]:
    """The admission order of `s`, the prefix length that maximises expected tokens per
    second, and that rate (first maximum on ties: the cheapest)."""
    num_requests = len(s)
    rows, gains = admission_order_rows(s)
    base = num_requests + others
    best, best_rate_, gain = 0, None, 0.0
    for j in range(len(gains) + 1):
        if j:
            gain += gains[j - 1]
        rate = (base + gain) / table.admission_time(base + other_tokens + j, num_requests, drafted=drafted,
                                                     others=others, other_tokens=other_tokens)
        if best_rate_ is None or rate > best_rate_:
            best, best_rate_ = j, rate
    return rows, best, best_rate_
