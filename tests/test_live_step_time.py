"""The step-time table corrected by measured steps (dspark.schedule.live): the curve
learned where the engine runs, the profile's shape kept where it does not, and the
scheduler's decisions following the corrected costs."""

from __future__ import annotations

import numpy as np
import pytest

from dspark.schedule.live import LiveCurve, LiveStepTime
from dspark.schedule.lookup_pricing import free_lengths
from dspark.schedule.policies import DSparkAsync
from dspark.schedule.step_time import DrafterTimeTable, StepTimeTable


def _flat_table(drafter_ms: float | None = None) -> StepTimeTable:
    """A profile that is too flat past 16 tokens (16 -> 32 tokens: +10 %)."""
    counts = [1, 2, 4, 8, 16, 24, 32, 48, 64]
    ms = [20.0, 21.0, 24.0, 32.0, 50.0, 52.0, 55.0, 80.0, 110.0]
    drafter = None if drafter_ms is None else DrafterTimeTable("dspark", [1, 4, 16], [drafter_ms] * 3)
    return StepTimeTable(token_counts=counts, raw_ms=ms, drafter=drafter)


def _real_ms(n: float) -> float:
    """The machine: 50 ms at 16 tokens and 3 ms per token beyond."""
    return 50.0 + 3.0 * max(0.0, n - 16) if n >= 16 else 20.0 + 1.875 * (n - 1)


def test_an_observed_count_takes_the_measured_time_and_its_neighbours_the_profile_shape():
    curve = LiveCurve([1, 16, 32, 64], [20.0, 50.0, 55.0, 110.0])
    assert curve.ms().tolist() == [20.0, 50.0, 55.0, 110.0]  # nothing seen: the profile
    for _ in range(40):
        curve.observe(16, 75.0)  # 1.5x the profile at 16
    ratio = curve.ratio()
    assert ratio[1] == pytest.approx(1.5, rel=1e-6)
    # only 16 was observed: every count keeps the profile's shape scaled by that ratio
    assert curve.ms().tolist() == pytest.approx([30.0, 75.0, 82.5, 165.0])
    for _ in range(40):
        curve.observe(32, 110.0)  # 2x the profile at 32
    ms = curve.ms()
    assert ms[2] == pytest.approx(110.0, rel=1e-6)
    assert ms[3] == pytest.approx(220.0, rel=1e-6)  # beyond the last observed: its ratio
    assert ms[0] == pytest.approx(30.0, rel=1e-6)  # below the first observed: its ratio


def test_a_step_between_two_counts_is_shared_and_the_curve_stays_non_decreasing():
    curve = LiveCurve([10, 20], [100.0, 100.0])
    for _ in range(100):
        curve.observe(12.5, 50.0)  # weights 0.75 / 0.25, both pulled toward 0.5x
    assert list(curve.weight) == pytest.approx([75.0, 25.0])
    assert curve.ratio()[0] == pytest.approx(0.5, rel=1e-3)
    assert curve.ratio()[1] == pytest.approx(0.5, rel=1e-3)
    for _ in range(100):
        curve.observe(10, 200.0)  # the low count now costs more than the high one
    ms = curve.ms()
    assert ms[1] >= ms[0]  # non-decreasing: the two, observed as often, pooled at their mean
    assert ms.tolist() == pytest.approx([125.0, 125.0], rel=1e-2)


def test_one_slow_step_at_a_count_seen_once_does_not_lift_the_counts_above_it():
    # the machine: 45 ms up to 32 tokens (one AMX tile row block), 55 ms from 33
    counts = list(range(24, 41))
    curve = LiveCurve(counts, [45.0 if n <= 32 else 55.0 for n in counts])
    for _ in range(17):
        curve.observe(32, 44.0)
        curve.observe(35, 56.0)
    curve.observe(29, 60.0)  # once, a step that waited (the first after a burst of prefills)
    ms = dict(zip(counts, curve.ms().tolist()))
    # a running maximum would price 29..34 at 60 ms: verifying 1-3 tokens at 32 requests free
    assert ms[32] < 47.0
    assert ms[35] - ms[32] > 8.0  # the tile edge stays visible to the scheduler
    assert all(a <= b for a, b in zip(curve.ms(), curve.ms()[1:]))


def test_single_stalls_are_clipped_and_old_observations_forgotten():
    curve = LiveCurve([1, 8], [10.0, 20.0], window=4, max_age=10, clip=4.0)
    curve.observe(1, 10_000.0)  # a 1000x stall counts as 4x
    assert curve.ratio()[0] == pytest.approx(4.0)
    curve.observe(1, 10.0)  # back to normal: 4x below the estimate, averaged with it
    assert curve.ratio()[0] == pytest.approx(2.0)
    far = LiveCurve([1, 8], [1.0, 2.0], window=4, clip=4.0)
    for _ in range(40):  # a profile 100x off is learned all the same, 4x per step at most
        far.observe(8, 200.0)
    assert far.ratio()[1] == pytest.approx(100.0, rel=1e-3)
    for _ in range(20):
        curve.observe(8, 20.0)
    # count 1 was last seen 20 observations ago (> max_age): forgotten, it follows count 8
    assert not curve.fresh()[0]
    assert curve.ratio()[0] == pytest.approx(1.0)


def test_the_exponential_average_follows_a_change_within_a_few_windows():
    curve = LiveCurve([1, 8], [10.0, 20.0], window=8)
    for _ in range(200):
        curve.observe(8, 20.0)
    for _ in range(40):
        curve.observe(8, 40.0)  # the machine halves its speed
    assert curve.ratio()[1] == pytest.approx(2.0, rel=0.02)


def test_the_scheduler_stops_buying_tokens_the_measured_curve_says_do_not_pay():
    # 16 requests whose drafts survive at 0.3 per token: by the flat profile 16 more
    # tokens cost 10 % for 30 % more output, so the budget is 16 tokens or more; the
    # machine charges 3 ms a token (16 more tokens: +96 %), so by the corrected curve
    # verifying nothing is best.
    table = _flat_table()
    survival = np.cumprod(np.full((16, 4), 0.3), axis=1)
    policy = DSparkAsync(table, lag=1)
    policy.choose(survival)  # the lagged history
    assert policy.budget(16, 4) >= 16
    assert sum(free_lengths(survival, table)) >= 16
    live = LiveStepTime(table)
    for n in (16, 32, 16, 32, 24, 16, 32, 48):
        for _ in range(8):
            live.record(n, _real_ms(n) / 1000.0)
    assert table.version > 0
    assert table.target_time(32) * 1000 == pytest.approx(_real_ms(32), rel=0.02)
    assert table.target_time(16) * 1000 == pytest.approx(_real_ms(16), rel=0.02)
    policy.choose(survival)
    assert policy.budget(16, 4) == 0
    assert sum(free_lengths(survival, table)) == 0
    # the profile as measured is kept for the record
    assert table.step_ms[table.token_counts.index(32)] == 55.0


def test_speculation_s_time_outside_target_and_drafter_is_measured_and_priced():
    """Steps that drafted or looked up spend 3 ms more outside the target and the
    drafter than plain steps: that becomes the level's overhead, and tokens that paid
    for themselves on the curve alone stop being verified (lookup) or drafted."""
    table = _flat_table(drafter_ms=1.0)
    live = LiveStepTime(table)
    s = np.array([[0.45, 0.1, 0.05]] * 4)  # four requests, lookup-like survivals
    assert sum(free_lengths(s, table)) > 0  # 24 -> 32 ms for 4 -> 8 tokens pays by the curve alone
    live.record_outside(4, True, 0.004, select_seconds=0.0015)
    # no plain step seen yet: a plain step is taken to cost the speculative one less its choosing
    assert table.spec_overhead(4) == pytest.approx(0.0015)
    for _ in range(40):
        live.record_outside(4, False, 0.001)
        live.record_outside(4, True, 0.004, select_seconds=0.0015)
    assert table.spec_overhead(4) == pytest.approx(0.003, rel=0.05)
    assert table.spec_overhead(1) == 0.0  # other levels keep their own
    assert live.summary()["spec_overhead_ms"]["4-7"] == pytest.approx(3.0, rel=0.05)
    assert free_lengths(s, table) == [0, 0, 0, 0]
    policy = DSparkAsync(table, lag=1)
    policy.choose(s)
    assert not policy.should_draft(4, 3)
    # a level without plain steps of its own compares with the level below
    for _ in range(40):
        live.record_outside(9, True, 0.0015)
    assert table.spec_overhead(9) == pytest.approx(0.0005, rel=0.1)


def test_a_drafting_step_s_own_time_outside_is_charged_to_the_drafter():
    """Hybrid drafting: plain steps spend 0.3 ms outside the target and the drafter,
    lookup-only steps 0.6 ms, drafting steps 5.6 ms of which 1 ms is the drafter's
    catch-up on skipped context. Drafting pays the 4 ms beyond a lookup step (with its
    call); the catch-up, which covers the skipped steps' tokens, is spread over every
    speculative step. Lumped together, every lookup step paid 2.8 ms and drafting
    looked 4 ms cheaper than it is."""
    table = _flat_table(drafter_ms=1.0)
    live = LiveStepTime(table)
    for _ in range(64):
        live.record_outside(1, False, 0.0003)
        live.record_outside(1, True, 0.0006, select_seconds=0.0002)
        live.record_outside(1, True, 0.0056, select_seconds=0.0012, drafted=True, catchup_seconds=0.001)
    assert table.draft_overhead(1) == pytest.approx(0.004, rel=0.02)
    assert table.spec_overhead(1) == pytest.approx(0.0003 + 0.0005, rel=0.1)
    drafted = table.admission_time(2, 1, drafted=True) - table.admission_time(2, 1, drafted=False)
    assert drafted == pytest.approx(0.001 + 0.004, rel=0.02)
    assert table.draft_overhead(4) == 0.0  # other levels keep their own
    assert live.summary()["draft_overhead_ms"]["1-1"] == pytest.approx(4.0, rel=0.02)
    # a drafter that only drafts (no lookup-only steps): its whole outside time is the
    # speculation overhead, as before, and nothing is charged twice
    only = _flat_table(drafter_ms=1.0)
    live = LiveStepTime(only)
    for _ in range(64):
        live.record_outside(1, False, 0.0003)
        live.record_outside(1, True, 0.0056, drafted=True, catchup_seconds=0.001)
    assert only.draft_overhead(1) == 0.0
    assert only.spec_overhead(1) == pytest.approx(0.0053, rel=0.02)


def test_drafting_time_is_learned_per_request_count_and_decides_skipping():
    # 4 requests, drafts surviving at 0.8 per token. The profile says drafting takes
    # 10 ms: verifying all 16 drafted tokens gives 13.45 tokens in 60 ms, more than
    # plain decoding's 4 in 24 ms. Drafting really takes 36 ms: 13.45 in 86 ms is less.
    table = _flat_table(drafter_ms=10.0)
    survival = np.cumprod(np.full((4, 4), 0.8), axis=1)
    policy = DSparkAsync(table, lag=1, probe_every=8)
    policy.choose(survival)
    assert policy.should_draft(4, 4)
    live = LiveStepTime(table)
    for _ in range(64):
        live.record(8, _real_ms(8) / 1000.0, drafted_requests=4, draft_seconds=0.036)
    assert table.drafter_time(4) * 1000 == pytest.approx(36.0, rel=0.01)
    assert table.drafter_time(16) * 1000 == pytest.approx(36.0, rel=0.01)  # the profile's shape
    assert not policy.should_draft(4, 4)
    summary = live.summary()
    assert summary["steps"] == 64 and summary["drafter"]["live_ms"][1] == pytest.approx(36.0, rel=0.01)
    assert summary["observed"][table.token_counts.index(8)]


def test_the_table_is_republished_every_few_steps_and_reads_what_was_published():
    """After its first `window` steps the live table hands its estimates to the
    scheduler's table every `publish_every` steps (each publication makes the scheduler
    recompute its rates); the table's times always follow what was published last."""
    table = _flat_table()
    live = LiveStepTime(table, window=16, publish_every=8)
    before = table.target_time(32)
    for _ in range(16):
        live.record(32, _real_ms(32) / 1000.0)
    assert table.version == 16  # the first window: every step
    assert table.target_time(32) != before and table.target_time(32) * 1000 == pytest.approx(
        float(np.interp(32, table.token_counts, live.target.ms())))
    for _ in range(64):
        live.record(32, _real_ms(32) / 1000.0)
        live.record_outside(4, True, 0.003)
        live.record_outside(4, False, 0.001)
    assert table.version <= 16 + 64 // 8 + 16 + 2 * 64 // 8 + 1  # curves and overheads, every 8th record
    assert table.target_time(32) * 1000 == pytest.approx(_real_ms(32), rel=0.02)
    assert table.spec_overhead(4) == pytest.approx(0.002, rel=0.1)
    table.scale(2.0)  # every change of the times is read at once
    assert table.target_time(32) * 1000 == pytest.approx(2 * _real_ms(32), rel=0.02)


def adaptive_hybrid_engine(target, **spec):
    """The default configuration (hybrid drafting, dspark-async) on a test target, with
    a synthetic step-time table, 8 requests at a time."""
    from dspark.engine.config import SpeculativeConfig
    from dspark.engine.engine import EngineConfig, LLMEngine

    table = StepTimeTable.synthetic(base_ms=30, knee=24, per_token_ms=1.5, max_tokens=512, drafter_ms=5)
    config = SpeculativeConfig(method="dspark", num_speculative_tokens=5, enable_adaptive_verification=True,
                               lookup=True, **spec)
    return LLMEngine(target, config, EngineConfig(max_num_seqs=8, max_model_len=512), step_table=table), table


def test_the_engine_feeds_the_live_table_and_stays_exact(greedy_case):  # noqa: F811
    from dspark.sampling import SamplingParams

    target, prompts, refs = greedy_case
    engine, table = adaptive_hybrid_engine(target)
    assert engine.live_table is not None
    seqs = engine.generate(prompts[:8], SamplingParams(max_tokens=24))
    for seq, ref in zip(seqs, refs[:8]):
        assert seq.output_ids == ref
    live = engine.live_table
    assert live.steps > 10 and table.version >= live.steps
    # what the engine measured is what the table now says, where the engine ran
    seen = engine.runner.last_forward_tokens
    assert table.target_time(seen) != pytest.approx(0.030)
    live.fold()  # the steps since the last publication, queued
    assert live.target.fresh()[int(np.searchsorted(live.target.counts, seen))]
    # the watch compares against the profile as it was, not the live curve
    assert engine.step_watch.table is not table and engine.step_watch.table.target_time(8) == pytest.approx(0.030)
    engine, _ = adaptive_hybrid_engine(target, live_step_time=False)
    assert engine.live_table is None and engine.speculate_or_plain is None
    engine, _ = adaptive_hybrid_engine(target, plain_fallback=True)
    assert engine.speculate_or_plain is not None


from test_speculative import greedy_case, tiny_target  # noqa: E402,F401  (fixtures)


def test_queued_steps_publish_the_curves_that_folding_each_step_would():
    """`record` queues a step and folds the queue only when it publishes: the table
    must read exactly the curve that observing every step at once gives."""
    table = StepTimeTable.synthetic(max_tokens=64)
    reference = StepTimeTable.synthetic(max_tokens=64)
    live = LiveStepTime(table, window=4, publish_every=3)
    curve = LiveCurve(reference.token_counts, reference.step_ms, window=4)
    rng = np.random.default_rng(0)
    for step in range(40):
        n = int(rng.integers(1, 64))
        seconds = float(rng.uniform(0.005, 0.05))
        live.record(n, seconds)
        curve.observe(n, seconds * 1000.0)
        if live._unpublished == 0:  # just published
            assert not live._queue
            assert table.target_times(np.array([1.0, 8.0, 33.0])).tolist() == pytest.approx(
                np.interp([1.0, 8.0, 33.0], reference.token_counts, curve.ms()) / 1000.0)
        else:
            assert len(live._queue) == live._unpublished
    assert live.steps == 40


def test_steps_recorded_unpublished_leave_the_table_alone_until_published():
    """`publish=False` (plain decoding by the governor's call): the table the scheduler
    reads does not change, the queue is folded every QUEUE_LIMIT steps to bound it, and
    a later `publish` hands over the curve every step would have made."""
    table = StepTimeTable.synthetic(max_tokens=64)
    live = LiveStepTime(table, window=4, publish_every=3)
    curve = LiveCurve(table.token_counts, table.step_ms, window=4)
    version, before = table.version, table.target_times(np.array([16.0])).tolist()
    for _ in range(LiveStepTime.QUEUE_LIMIT + 5):
        live.record(16, 0.05, publish=False)
        curve.observe(16, 50.0)
    assert table.version == version and table.target_times(np.array([16.0])).tolist() == before
    assert len(live._queue) == 5  # the first QUEUE_LIMIT were folded, unpublished
    live.publish()
    assert table.version > version
    assert table.target_time(16) == pytest.approx(float(np.interp(16, table.token_counts, curve.ms())) / 1000.0)
    assert table.target_time(16) > before[0] * 2  # it learned the slower steps
