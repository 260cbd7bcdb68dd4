"""The scheduler's plain-Python pricing of small steps (every speculating step prices one
right after a forward, where numpy's per-call cost was most of the pricing's time): the
same lengths, rates and histories as the numpy pricing it stands in for."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dspark.schedule import DrafterTimeTable, DSparkAsync, StepTimeTable


def test_small_tables_are_priced_in_plain_python_to_the_same_lengths():
    """Lookup's pricing of a small table (the engine's every step) runs in plain Python;
    it must choose exactly what the numpy pricing chooses: random tables with ties,
    requests and prompt tokens beside them, a speculation overhead, and counts past the
    profiled range. Bad tables are refused the same way."""
    from dspark.schedule.lookup_pricing import _free_lengths_array, _free_lengths_small, free_lengths
    from dspark.schedule.survival import small_survival_rows

    rng = np.random.default_rng(0)
    table = StepTimeTable(token_counts=[1, 2, 3, 4, 6, 8, 12, 16], raw_ms=[9.0, 9.6, 11.0, 10.1, 11.5, 15.0, 19.0, 24.0])
    table.set_spec_overhead(1, 0.0004)
    table.set_spec_overhead(4, 0.0011)
    differ = 0
    for trial in range(400):
        r, g = int(rng.integers(1, 9)), int(rng.integers(1, 8))
        if r * g > 64:
            continue
        conf = rng.choice([0.2, 0.5, 0.8, 0.9, 1.0], size=(r, g)) if trial % 2 else rng.random((r, g))
        s = np.cumprod(conf, axis=1)
        others, other_tokens = int(rng.integers(0, 5)), int(rng.integers(0, 3)) * int(rng.integers(0, 12))
        small = _free_lengths_small(small_survival_rows(torch.tensor(s)), table, others, other_tokens)
        assert small == _free_lengths_array(s, table, others, other_tokens), (s, others, other_tokens)
        differ += small != [g] * r and sum(small) > 0
    assert differ > 50  # the tables exercised partial admissions, not only all or nothing
    for bad in ([[0.5, 0.7]], [[float("nan")]], [[1.5]]):
        with pytest.raises(ValueError, match="survival"):
            free_lengths(bad, table)


def test_small_steps_are_budgeted_in_plain_python_to_the_same_rates():
    """`DSparkAsync` prices a small step's budgets in plain Python (every speculating
    step asks, right after a forward); the rates must be the numpy pricing's own
    numbers, lagged steps of another request count, prompt tokens, a drafter and a
    speculation overhead included, so the budgets and skip decisions are the same."""
    from dspark.schedule import policies

    rng = np.random.default_rng(1)
    table = StepTimeTable(token_counts=[1, 2, 3, 4, 6, 8, 12, 16], raw_ms=[9.0, 9.6, 11.0, 10.1, 11.5, 15.0, 19.0, 24.0],
                          drafter=DrafterTimeTable(method="dspark", request_counts=[1, 4, 16], raw_ms=[2.8, 4.0, 9.0]))
    table.set_spec_overhead(2, 0.0007)
    checked = 0
    for trial in range(300):
        pol = DSparkAsync(table, lag=1)
        r0, g = int(rng.integers(1, 7)), int(rng.integers(1, 8))
        pol.choose(np.cumprod(rng.choice([0.3, 0.6, 0.9, 1.0], size=(r0, g)) if trial % 2 else rng.random((r0, g)),
                              axis=1))
        r = int(rng.integers(1, 7))
        others, other_tokens = int(rng.integers(0, 4)), int(rng.integers(0, 2)) * int(rng.integers(0, 9))
        if r * g > policies.SMALL_TABLE:
            continue
        small = pol._rates(r, g, others, other_tokens)
        pol._rates_cache = None
        keep, policies.SMALL_TABLE = policies.SMALL_TABLE, -1  # the numpy pricing
        vector_calls = []
        vector = table.admission_times
        table.admission_times = lambda *a, **k: vector_calls.append(1) or vector(*a, **k)
        try:
            array = pol._rates(r, g, others, other_tokens)
        finally:
            policies.SMALL_TABLE = keep
            del table.admission_times
        assert vector_calls and small == array, (trial, small, array)
        checked += 1
    assert checked > 200


def test_small_steps_choose_in_plain_python_the_numpy_lengths_and_history(monkeypatch):
    """`DSparkAsync.choose` of a small table (a drafting step at a few requests) in plain
    Python: over a run of steps (each one's budget rests on the lagged ones, so a
    history that differed would show later), the same lengths, budgets and histories
    as the numpy path."""
    from dspark.schedule import survival

    rng = np.random.default_rng(2)
    table = StepTimeTable(token_counts=[1, 2, 3, 4, 6, 8, 12, 16], raw_ms=[9.0, 9.6, 11.0, 10.1, 11.5, 15.0, 19.0, 24.0],
                          drafter=DrafterTimeTable(method="dspark", request_counts=[1, 4, 16], raw_ms=[2.8, 4.0, 9.0]))
    table.set_spec_overhead(2, 0.0007)
    python, array = DSparkAsync(table, lag=2), DSparkAsync(table, lag=2)
    partial = 0
    for step in range(300):
        r, g = int(rng.integers(1, 9)), int(rng.integers(1, 8))
        if r * g > survival.SMALL_TABLE:
            continue
        conf = rng.choice([0.3, 0.6, 0.9, 1.0], size=(r, g)) if step % 2 else rng.random((r, g))
        s = torch.tensor(np.cumprod(conf, axis=1), dtype=torch.float32)  # as the engine passes it
        others, other_tokens = int(rng.integers(0, 3)), int(rng.integers(0, 2)) * int(rng.integers(0, 9))
        got = python.choose(s, others, other_tokens)
        with monkeypatch.context() as m:
            m.setattr(survival, "SMALL_TABLE", -1)  # the numpy path
            want = array.choose(s, others, other_tokens)
        assert got == want and python.last_budget == array.last_budget, (step, got, want)
        assert all(np.array_equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(python._history, array._history))
        partial += 0 < sum(got) < r * g
    assert partial > 20  # budgets between nothing and everything were exercised
