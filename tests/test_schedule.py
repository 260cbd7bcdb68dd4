"""The verification-length scheduler: the policies' exact choices (the step-time table:
test_step_time_table.py; the losslessness trap of the paper's Appendix A:
test_schedule_lossless.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from dspark.schedule import (
    POLICY_NAMES,
    ConfidenceThreshold,
    DSparkAsync,
    DSparkSync,
    FixedLength,
    NoSpeculation,
    ScheduleError,
    StepTimeTable,
    make_policy,
)


def survival_from(confidence: list[list[float]]) -> np.ndarray:
    return np.cumprod(np.asarray(confidence, dtype=np.float64), axis=1)


def table_from_seconds(seconds: list[float]) -> StepTimeTable:
    """A table measured at 1, 2, 3, ... tokens with these step times."""
    return StepTimeTable(token_counts=list(range(1, len(seconds) + 1)), raw_ms=[1000.0 * t for t in seconds])


def admission_order(s: np.ndarray) -> list[tuple[int, int]]:
    rows, cols = s.shape
    return sorted(((i, k) for i in range(rows) for k in range(cols)), key=lambda ik: (-s[ik], ik[1], ik[0]))


def rate(s: np.ndarray, admitted: list[tuple[int, int]], table: StepTimeTable) -> float:
    rows = s.shape[0]
    expected = rows + sum(s[ik] for ik in admitted)
    return expected / table.step_time(rows + len(admitted), rows)


def lengths_of(admitted: list[tuple[int, int]], rows: int) -> list[int]:
    lengths = [0] * rows
    for i, _ in admitted:
        lengths[i] += 1
    return lengths


def algorithm1(s: np.ndarray, table: StepTimeTable) -> list[int]:
    """Algorithm 1 written as the plain loop, to pin the vectorised DSparkSync."""
    order, admitted = admission_order(s), []
    best = rate(s, admitted, table)
    for ik in order:
        candidate = rate(s, admitted + [ik], table)
        if not candidate > best:
            break
        admitted.append(ik)
        best = candidate
    return lengths_of(admitted, s.shape[0])


class RetrospectiveSearch:
    """The trap, kept out of the package on purpose: a synchronous scheduler that
    evaluates every prefix of the admission order of the CURRENT draft and keeps the
    best one. It lets s_{i,k+1} (which depends on drafted token k) decide whether
    token k, or token 1 versus no speculation, is verified."""

    def __init__(self, table: StepTimeTable) -> None:
        self.table = table

    def choose(self, survival: np.ndarray) -> list[int]:
        s = np.asarray(survival, dtype=np.float64)
        order = admission_order(s)
        best_m = max(range(len(order) + 1), key=lambda m: (rate(s, order[:m], self.table), -m))
        return lengths_of(order[:best_m], s.shape[0])


def budget_by_whole_search(s: np.ndarray, table: StepTimeTable) -> int:
    order = admission_order(s)
    return max(range(len(order) + 1), key=lambda m: (rate(s, order[:m], table), -m))


# -- step-time table ---------------------------------------------------------------


def test_baselines():
    s = survival_from([[0.9, 0.7, 0.5], [0.6, 0.5, 0.5]])  # [[.9 .63 .315], [.6 .3 .15]]
    assert NoSpeculation().choose(s) == [0, 0]
    assert FixedLength(2).choose(s) == [2, 2]
    assert FixedLength(7).choose(s) == [3, 3]
    assert FixedLength().choose(torch.empty(4, 5)) == [5] * 4
    assert ConfidenceThreshold(0.5).choose(s) == [2, 1]
    assert ConfidenceThreshold(0.0).choose(s) == [3, 3]
    assert ConfidenceThreshold(1.0).choose(s) == [0, 0]
    assert ConfidenceThreshold(0.3).choose(torch.tensor(s, dtype=torch.bfloat16)) == [3, 2]


def test_sync_with_flat_table_admits_every_positive_survival():
    flat = StepTimeTable(token_counts=[1], raw_ms=[10.0])
    s = survival_from([[0.9, 0.5, 0.0, 0.7], [0.3, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    assert DSparkSync(flat).choose(s) == [2, 1, 4]


def test_sync_with_steep_table_admits_nothing():
    proportional = StepTimeTable(token_counts=[1, 1000], raw_ms=[1.0, 1000.0])  # T(n) = n ms
    s = survival_from([[0.99, 0.99], [0.5, 0.4], [1.0, 0.9]])
    assert DSparkSync(proportional).choose(s) == [0, 0, 0]


def test_sync_breaks_at_the_first_drop_where_whole_search_does_not():
    # App. A: rates 1.0 / 0.5 / 0.45 for 1 / 2 / 3 tokens; c1 = 0.8, c2 = 0.9
    table = table_from_seconds([1 / 1.0, 1 / 0.5, 1 / 0.45])
    s = survival_from([[0.8, 0.9]])
    assert DSparkSync(table).choose(s) == [0]
    assert RetrospectiveSearch(table).choose(s) == [2]
    assert algorithm1(s, table) == [0]


def test_sync_matches_algorithm1_and_respects_prefixes_on_random_cases():
    rng = np.random.default_rng(0)
    for _ in range(300):
        rows, cols = int(rng.integers(1, 7)), int(rng.integers(1, 6))
        confidence = rng.uniform(0.2, 1.0, size=(rows, cols))
        confidence[rng.random((rows, cols)) < 0.15] = 1.0  # ties inside a row
        s = survival_from(confidence.tolist())
        counts = sorted(set(rng.integers(1, 40, size=6).tolist()) | {1})
        table = StepTimeTable(token_counts=counts, raw_ms=rng.uniform(1.0, 5.0, size=len(counts)).tolist())
        lengths = DSparkSync(table).choose(s)
        assert lengths == algorithm1(s, table)
        # the admitted set is an upper set of the survival order: no skipped entry
        # outranks an admitted one
        admitted = [s[i, k] for i in range(rows) for k in range(lengths[i])]
        skipped = [s[i, lengths[i]] for i in range(rows) if lengths[i] < cols]
        if admitted and skipped:
            assert min(admitted) >= max(skipped)


def test_top_budget_breaks_ties_by_lower_position():
    flat = StepTimeTable(token_counts=[1], raw_ms=[1.0])
    policy = DSparkAsync(flat, lag=2, warmup_length=1)  # warm-up budget: one token per request
    s = survival_from([[0.9, 1.0, 1.0], [0.9, 0.5, 0.2]])
    assert policy.choose(s) == [1, 1]
    assert policy.last_budget == 2


def test_async_uses_the_lagged_budget_not_the_current_survivals():
    table = StepTimeTable.synthetic(base_ms=10.0, knee=4, per_token_ms=1.0, max_tokens=64)
    confident = survival_from([[0.99] * 6] * 3)
    doubtful = survival_from([[0.3] * 6] * 3)
    high, low = budget_by_whole_search(confident, table), budget_by_whole_search(doubtful, table)
    assert high > low

    policy = DSparkAsync(table, lag=2, warmup_length=1)
    assert policy.choose(confident) == [1, 1, 1]  # warm-up
    assert policy.choose(doubtful) == [1, 1, 1]  # warm-up
    lengths = policy.choose(doubtful)  # budget from `confident`, two steps back
    assert policy.last_budget == high and sum(lengths) == high
    lengths = policy.choose(confident)  # budget from the first `doubtful`
    assert policy.last_budget == low and sum(lengths) == low
    policy.reset()
    assert policy.choose(confident) == [1, 1, 1]


def test_async_searches_the_whole_table():
    # J by budget is 1.0, 0.9, 1.134: the best budget lies past a drop
    table = table_from_seconds([1 / 1.0, 1 / 0.5, 1 / 0.45])
    s = survival_from([[0.8, 0.9]])
    policy = DSparkAsync(table, lag=1, warmup_length=0)
    assert policy.choose(s) == [0]
    assert policy.choose(s) == [2]


def test_async_budget_scales_with_the_batch():
    table = StepTimeTable.synthetic(base_ms=10.0, knee=8, per_token_ms=0.7, max_tokens=256)
    rng = np.random.default_rng(1)
    lagged = survival_from(rng.uniform(0.5, 1.0, size=(2, 5)).tolist())
    from_pair, from_copies = DSparkAsync(table, lag=1), DSparkAsync(table, lag=1)
    from_pair.choose(lagged)
    from_copies.choose(np.concatenate([lagged, lagged]))
    # the lagged profile scaled to four requests is the duplicated matrix, exactly
    assert from_pair.budget(4, 5) == from_copies.budget(4, 5) == budget_by_whole_search(
        np.concatenate([lagged, lagged]), table
    )
    shrunk = from_copies.budget(1, 5)
    assert 0 <= shrunk <= 5
    current = survival_from(rng.uniform(0.5, 1.0, size=(4, 5)).tolist())
    assert sum(from_pair.choose(current)) == from_copies.budget(4, 5)


def test_empty_inputs():
    table = StepTimeTable.synthetic()
    for policy in (NoSpeculation(), FixedLength(3), ConfidenceThreshold(0.5), DSparkSync(table), DSparkAsync(table)):
        assert policy.choose(np.zeros((0, 4))) == []
        assert policy.choose(np.zeros((3, 0))) == [0, 0, 0]


def test_bad_survival_fails_loudly():
    policy = DSparkSync(StepTimeTable.synthetic())
    with pytest.raises(ValueError, match="non-increasing"):
        policy.choose([[0.5, 0.9]])
    with pytest.raises(ValueError, match="shape"):
        policy.choose([0.5, 0.4])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        policy.choose([[1.5, 0.4]])


def test_make_policy():
    table = StepTimeTable.synthetic()
    assert isinstance(make_policy("none"), NoSpeculation)
    assert make_policy("fixed", num_speculative_tokens=3).choose(np.ones((2, 5))) == [3, 3]
    assert make_policy("threshold", threshold=0.7).tau == 0.7
    assert isinstance(make_policy("dspark-sync", table=table), DSparkSync)
    policy = make_policy("dspark-async", table=table, num_speculative_tokens=2, lag=3, warmup_length=2)
    assert isinstance(policy, DSparkAsync) and policy.lag == 3 and policy.warmup_length == 2
    assert make_policy("dspark-async", table=table, num_speculative_tokens=2).warmup_length is None
    assert set(POLICY_NAMES) == {"none", "fixed", "threshold", "dspark-sync", "dspark-async"}
    with pytest.raises(ScheduleError, match="unknown verification policy 'eagle'.*dspark-async"):
        make_policy("eagle")
    with pytest.raises(ScheduleError, match="step-time table"):
        make_policy("dspark-sync")
    with pytest.raises(ScheduleError, match="non-negative integer"):
        make_policy("fixed", num_speculative_tokens=-1)
    with pytest.raises(ScheduleError, match=r"\[0, 1\]"):
        make_policy("threshold", threshold=1.5)
    with pytest.raises(ScheduleError, match="lag must be"):
        make_policy("dspark-async", table=table, lag=0)


def test_choose_is_fast_at_64_requests_by_16_tokens():
    table = StepTimeTable.synthetic(drafter_ms=2.0)
    survival = torch.cumprod(torch.rand(64, 16, generator=torch.Generator().manual_seed(0)) * 0.3 + 0.7, dim=1)
    for policy in (DSparkSync(table), DSparkAsync(table, lag=2)):
        for _ in range(10):
            policy.choose(survival)
        start = time.perf_counter()
        for _ in range(100):
            policy.choose(survival)
        per_call = (time.perf_counter() - start) / 100
        assert per_call < 5e-3, f"{policy.name} took {per_call * 1e3:.2f} ms per step"


def test_async_first_budgets_come_from_a_prior_not_every_drafted_token():
    """Before `lag` steps are seen, the budget is priced on the prior profile: at one
    request on a flat curve, verification pays; at sixteen requests past the curve's
    knee, the first step verifies a few tokens, not all 16 x 7 drafted ones."""
    table = StepTimeTable.synthetic(base_ms=10.0, knee=16, per_token_ms=1.0, max_tokens=256)
    one = DSparkAsync(table, lag=2)
    assert sum(one.choose(survival_from([[0.9] * 7]))) >= 2
    many = DSparkAsync(table, lag=2)
    first = many.choose(survival_from([[0.9] * 7] * 16))
    assert sum(first) < 16
    fixed = DSparkAsync(table, lag=2, warmup_length=3)  # an explicit warm-up length stays as it was
    assert fixed.choose(survival_from([[0.9] * 7] * 16)) == [3] * 16


def test_async_skips_the_drafter_while_it_does_not_pay_and_probes():
    # drafting costs 30 ms on a 10 ms target step: worth it only with confident drafts
    table = StepTimeTable.synthetic(base_ms=10.0, knee=16, per_token_ms=1.0, max_tokens=64, drafter_ms=30.0)
    doubtful = survival_from([[0.2] * 4] * 2)
    confident = survival_from([[0.99] * 4] * 2)
    policy = DSparkAsync(table, lag=1, probe_every=3)
    assert policy.should_draft(2, 4)  # nothing seen yet: draft, to learn the survivals
    policy.choose(doubtful)
    decisions = [policy.should_draft(2, 4) for _ in range(60)]
    # probes after 3 skipped steps, then 6, 12, 24 (the cap, 8 x 3), 24
    probes = [i for i, d in enumerate(decisions) if d]
    assert probes == [2, 8, 20, 44] and policy.skipped_steps == 56
    policy.choose(confident)
    assert policy.should_draft(2, 4)
    policy.choose(doubtful)  # paying again reset the gap
    assert [policy.should_draft(2, 4) for _ in range(3)] == [False, False, True]
    never = DSparkAsync(table, lag=1, probe_every=0)
    never.choose(doubtful)
    assert never.should_draft(2, 4)
    # without a drafter cost any useful draft pays: never skip
    free = DSparkAsync(StepTimeTable.synthetic(base_ms=10.0, knee=16, per_token_ms=1.0, max_tokens=64), lag=1)
    free.choose(doubtful)
    assert free.should_draft(2, 4)
    with pytest.raises(ScheduleError, match="probe_every"):
        DSparkAsync(table, probe_every=-1)


def test_a_step_is_priced_with_the_requests_and_prompt_tokens_that_verify_nothing():
    """Four requests' drafts in a step that also carries twelve requests verifying nothing:
    on a curve flat to 16 tokens and steep after, the drafts are nearly free for four
    requests alone and not worth verifying in the whole step; prompt tokens in the
    same forward count the same way. Every pricing policy, and lookup's."""
    from dspark.schedule.lookup_pricing import free_lengths

    table = StepTimeTable.synthetic(base_ms=10.0, knee=16, per_token_ms=0.625, max_tokens=256)
    s = np.full((4, 2), 0.6)  # 8 entries at survival 0.6
    assert sum(free_lengths(s, table)) == 8  # 4 + 8 tokens: still on the flat part
    assert sum(free_lengths(s, table, others=12)) == 0  # 16 + B: each token 6 % of a step for 0.6
    # a prompt chunk places the drafts past the knee but is not charged to them: four
    # decoding requests still gain from drafts at 0.6 (0.96 tokens a ms against 0.4)
    assert sum(free_lengths(s, table, other_tokens=12)) == 8
    assert sum(free_lengths(np.full((4, 2), 0.2), table)) == 8
    assert sum(free_lengths(np.full((4, 2), 0.2), table, other_tokens=12)) == 0  # 0.32 a ms
    assert sum(DSparkSync(table).choose(s)) == 8
    assert sum(DSparkSync(table).choose(s, others=12)) == 0
    lagged = DSparkAsync(table, lag=1)
    lagged.choose(s)  # the lag's step
    assert lagged.budget(4, 2) == 8 and lagged.budget(4, 2, others=12) == 0
    assert sum(lagged.choose(s, others=12)) == 0
    # four others keep the step on the flat part: the drafts are free again
    assert sum(free_lengths(s, table, others=4)) == 8
    # the overhead of speculating is the whole step's load level, and only when verifying
    table.set_spec_overhead(16, 0.004)
    assert table.admission_times(np.array([16, 17]), 4, drafted=False, others=12).tolist() == pytest.approx(
        [0.010, 0.010625 + 0.004])
    assert table.admission_times(np.array([16, 18]), 4, drafted=False, other_tokens=12).tolist() == pytest.approx(
        [0.010, 0.01125])  # T(4) then what 2 tokens add past 16; the overhead of 4 requests' level: none measured
