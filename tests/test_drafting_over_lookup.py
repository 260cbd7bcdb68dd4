"""Hybrid drafting priced against lookup alone before a step drafts: the rate of a
prefix choice, the two survival estimates it compares, and an engine that leaves the
drafter out where lookup alone is priced higher, still decoding what plain decoding
decodes."""

from __future__ import annotations

import itertools
import random
import time
from types import SimpleNamespace

import pytest

from dspark.drafters.hybrid import HybridDrafter
from dspark.drafters.lookup import LookupCalibration
from dspark.engine.config import SpeculativeConfig
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.sampling import SamplingParams
from dspark.schedule.lookup_pricing import best_rate
from dspark.schedule.step_time import DrafterTimeTable, StepTimeTable

from test_hybrid import _table
from test_speculative import greedy_case  # noqa: F401  (fixture)


def _brute_rate(s, table, drafted, others, other_tokens):
    """Every length vector, not only prefixes of the admission order."""
    r = len(s)
    best = 0.0
    for lengths in itertools.product(range(len(s[0]) + 1), repeat=r):
        expected = r + others + sum(sum(row[:n]) for row, n in zip(s, lengths))
        t = table.admission_time(r + others + other_tokens + sum(lengths), r, drafted=drafted, others=others,
                                 other_tokens=other_tokens)
        best = max(best, expected / t)
    return best


def test_best_rate_is_the_best_of_every_length_choice():
    rng = random.Random(3)
    table = StepTimeTable(token_counts=[1, 2, 3, 4, 8, 16], raw_ms=[10.0, 10.5, 18.0, 19.0, 30.0, 50.0],
                          drafter=DrafterTimeTable(method="x", request_counts=[1, 4], raw_ms=[3.0, 6.0]))
    for _ in range(40):
        r, g = rng.randint(1, 3), rng.randint(1, 4)
        s = []
        for _ in range(r):
            v, row = 1.0, []
            for _ in range(g):
                v *= rng.random() ** 0.3
                row.append(v)
            s.append(row)
        others, other_tokens = rng.randint(0, 2), rng.choice([0, 0, 5])
        for drafted in (False, True):
            assert best_rate(s, table, drafted, others, other_tokens) == \
                pytest.approx(_brute_rate(s, table, drafted, others, other_tokens))
    # the drafter's time lowers the rate of the same proposals
    s = [[0.9, 0.8, 0.5]]
    assert best_rate(s, table, True) < best_rate(s, table, False)


def _hybrid(tmp_path, per_position):
    inner = SimpleNamespace(confidence_head=object(), target=None, target_layer_ids=[1], max_draft_tokens=5,
                            device="cpu")
    h = HybridDrafter(inner, LookupCalibration.load(_table(tmp_path, per_position)))
    h.drafter_trust.enabled = False  # the drafter's mean as it is
    h.trust.enabled = False
    return h


def test_survivals_with_and_without_the_drafter(tmp_path):
    h = _hybrid(tmp_path, [0.9, 0.8, 0.2, 0.2, 0.2])
    seq = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]  # lookup proposes 7 8 9 5 6 ...
    assert h.survivals_with_and_without(["r"], [(seq, [])], 5) is None  # the drafter never ran
    h.drafter_mean = [0.7, 0.6, 0.5, 0.4, 0.3]
    before = dict(h.counts)
    alone, hybrid = h.survivals_with_and_without(["r"], [(seq, [])], 5)
    c = [(0.9 * 1000 + 1) / 1002, (0.8 * 1000 + 1) / 1002, (0.2 * 1000 + 1) / 1002]
    assert alone[0][:3] == pytest.approx([c[0], c[0] * c[1], c[0] * c[1] * c[2]])
    # lookup while at least the drafter's mean (positions 0 and 1), then the mean
    assert hybrid[0] == pytest.approx([c[0], c[0] * c[1], c[0] * c[1] * 0.5, c[0] * c[1] * 0.5 * 0.4,
                                       c[0] * c[1] * 0.5 * 0.4 * 0.3])
    assert dict(h.counts) == before and not h._last  # nothing recorded
    # nothing matched: lookup's survivals are zeros, the hybrid's the drafter's mean
    alone, hybrid = h.survivals_with_and_without(["r"], [([1, 2, 3, 4], [])], 5)
    assert alone == [[0.0] * 5]
    assert hybrid[0] == pytest.approx([0.7, 0.42, 0.21, 0.084, 0.0252])


@pytest.mark.slow
@pytest.mark.parametrize("greedy_case", ["fp32"], indirect=True)
def test_a_slow_drafter_is_left_out_where_lookup_matches_and_output_stays_exact(greedy_case, tmp_path):  # noqa: F811
    target, prompts, refs = greedy_case
    steps = StepTimeTable.synthetic(base_ms=30, knee=24, per_token_ms=1.5, max_tokens=512, drafter_ms=200.0)
    spec = SpeculativeConfig(method="dspark", num_speculative_tokens=5, verification_policy="dspark-async",
                             lookup=True, lookup_calibration=_table(tmp_path, [0.95] * 7))
    engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=1, max_model_len=512), step_table=steps)
    engine.runner.policy.should_draft = lambda num_requests, num_drafted: True  # price every step here
    seqs = engine.generate(prompts[:6], SamplingParams(max_tokens=24))
    for seq, ref in zip(seqs, refs[:6]):
        assert seq.output_ids == ref
    # lookup sure of its tokens and the drafter costing 200 ms: wherever lookup matched,
    # the step looked up alone (and verified lookup's tokens)
    runner = engine.runner
    assert runner.priced_out > 0
    assert runner.drafter.counts["lookup_only"] >= runner.priced_out
    assert engine.total_stats().accepted_tokens > 0


def _governed(target, max_num_seqs: int, lookup: bool = True, max_model_len: int = 512,
              live: bool = True) -> LLMEngine:
    """The default configuration's shape (adaptive verification, the fallback from 8
    requests with trials from 2) on a synthetic step-time table; `live=False` keeps that
    table as it is (no live correction from the machine's measured steps)."""
    table = StepTimeTable.synthetic(base_ms=30, knee=24, per_token_ms=1.5, max_tokens=512, drafter_ms=1.0)
    spec = SpeculativeConfig(method="dspark", num_speculative_tokens=5, enable_adaptive_verification=True,
                             lookup=lookup, plain_fallback=8, plain_trials_from=2, live_step_time=live)
    return LLMEngine(target, spec, EngineConfig(max_num_seqs=max_num_seqs, max_model_len=max_model_len),
                     step_table=table)


def _after_each_step(engine: LLMEngine, see) -> None:
    """Call `see()` after every engine step."""
    step = engine.step

    def stepped():
        out = step()
        see()
        return out

    engine.step = stepped


@pytest.mark.slow
@pytest.mark.parametrize("greedy_case", ["fp32"], indirect=True)
@pytest.mark.parametrize("lookup", [True, False])
def test_a_drafter_slower_than_its_absence_is_turned_off_by_measurement(greedy_case, lookup):  # noqa: F811
    """At the load levels speculate_or_plain leaves speculating, drafter_or_lookup runs the
    drafter or not (hybrid drafting: lookup alone; a drafter alone: plain decoding's
    step) by measured throughput: a drafter made 50 ms slower a call loses its trials,
    and the steps go on without it, exact."""
    from dspark.engine.load_governor import OFF, ON, LoadGovernor

    target, prompts, refs = greedy_case
    engine = _governed(target, 1, lookup)
    assert engine.drafter_or_lookup is not None and not engine.speculate_or_plain.governs(1)
    engine.drafter_or_lookup = LoadGovernor(trial=4, min_gap=8, max_gap=64, warmup=1)  # decide quickly
    runner = engine.runner
    runner.policy.should_draft = lambda num_requests, num_drafted: True  # the scheduler would draft every step
    runner._drafting_over_lookup = lambda decodes, rows, n, prefill_tokens: rows
    drafter, modes = runner.drafter, []
    draft = drafter.draft

    def slow(*args, **kwargs):
        time.sleep(0.05)
        return draft(*args, **kwargs)

    drafter.draft = slow
    _after_each_step(engine, lambda: modes.append(runner.drafter_on))
    seqs = engine.generate(prompts[:8], SamplingParams(max_tokens=24))
    for seq, ref in zip(seqs, refs[:8]):
        assert seq.output_ids == ref
    level = engine.drafter_or_lookup.levels[0]
    assert level.mode == OFF and level.steps[OFF] > level.steps[ON] > 0
    assert modes[-16:] == [False] * 16  # the last steps ran without the drafter
    assert engine.total_stats().accepted_tokens > 0


@pytest.mark.slow
@pytest.mark.parametrize("greedy_case", ["fp32"], indirect=True)
def test_a_long_stretch_with_the_drafter_off_lets_it_go_instead_of_feeding_it(greedy_case):  # noqa: F811
    """With the drafter off (lookup alone), a request's backlog of context reaching
    PENDING_FLUSH tokens is dropped (the request goes on with lookup alone) rather
    than fed to a drafter that may not run again; the output stays exact."""
    from dspark.engine.context_feed import PENDING_FLUSH

    target, prompts, _ = greedy_case
    params = SamplingParams(max_tokens=PENDING_FLUSH, ignore_eos=True)
    ref = LLMEngine(target, None, EngineConfig(max_num_seqs=1, max_model_len=1024)).generate(prompts[:1], params)
    engine = _governed(target, 1, max_model_len=1024)
    engine.drafter_or_lookup.on = lambda num_requests: False  # lookup alone throughout
    runner, fed, let_go = engine.runner, [], set()
    append = runner.drafter.append_context

    def spy(request_ids, tokens, *args):
        fed.append(sum(map(len, tokens)))
        return append(request_ids, tokens, *args)

    runner.drafter.append_context = spy
    _after_each_step(engine, lambda: let_go.update(runner.contextless))
    [seq] = engine.generate(prompts[:1], params)
    assert seq.output_ids == ref[0].output_ids
    assert not runner.drafter_on and fed == [] and len(let_go) == 1
    assert engine.total_stats().accepted_tokens > 0  # lookup served it


@pytest.mark.slow
@pytest.mark.parametrize("greedy_case", ["fp32"], indirect=True)
def test_hybrid_drafting_starts_every_level_with_lookup_alone(greedy_case):  # noqa: F811
    """Hybrid drafting runs lookup alone first at every load level, the governed ones and
    those below them alike: the drafter is not called until a trial shows it pays."""
    from dspark.engine.load_governor import OFF

    target, prompts, refs = greedy_case
    engine = _governed(target, 4)
    engine.speculate_or_plain.on = lambda num_requests: True  # every level speculates here
    runner, drafted_at = engine.runner, []
    runner.policy.should_draft = lambda num_requests, num_drafted: True
    runner._drafting_over_lookup = lambda decodes, rows, n, prefill_tokens: rows
    draft = runner.drafter.draft

    def spy(requests, *args, **kwargs):
        drafted_at.append(sum(s.prefilled for s in engine.running))
        return draft(requests, *args, **kwargs)

    runner.drafter.draft = spy
    # four requests, three of 4 tokens and one of 24: 4 running, then 1 (or 2-3 between)
    lengths = [4, 4, 4, 24]
    seqs = [engine.add_request(p, SamplingParams(max_tokens=n)) for p, n in zip(prompts[1:5], lengths)]
    while engine.has_unfinished():
        engine.step()
    for seq, ref, n in zip(seqs, refs[1:5], lengths):
        assert seq.output_ids == ref[:n]
    levels = engine.drafter_or_lookup.levels
    assert {0, 2} <= set(levels)  # one request and four were reached
    for level in levels.values():
        assert level.start == OFF and level.steps[OFF] > 0
    assert drafted_at == []


@pytest.mark.slow
@pytest.mark.parametrize("greedy_case", ["fp32"], indirect=True)
def test_a_drafter_that_beats_lookup_alone_is_turned_on_by_measurement(greedy_case):  # noqa: F811
    """From lookup alone first, drafter_or_lookup's trial runs the drafter, and where
    it is faster and emits more (here: lookup alone made to find nothing) the level
    keeps it; exact. The governor's clock is the test's: every step costs what a plain
    step costs (a wall clock on a busy machine can make either mode lose a 4-step block),
    so the drafter wins on the tokens it emits, counted. The step-time table stays the
    synthetic one: corrected live from a busy machine's steps, it could price the drafter's
    verification lengths down to nothing (the suite once saw the level stay off)."""
    from dspark.engine.load_governor import ON, LoadGovernor

    target, prompts, refs = greedy_case
    engine = _governed(target, 1, live=False)
    governor = engine.drafter_or_lookup = LoadGovernor(from_requests=1, trial=4, min_gap=8, max_gap=64, warmup=1)
    record = governor.record
    governor.record = lambda n, out, seconds, plain, *rest: record(n, out, plain, plain, *rest)
    runner, modes = engine.runner, []
    runner.policy.should_draft = lambda num_requests, num_drafted: True
    runner._drafting_over_lookup = lambda decodes, rows, n, prefill_tokens: rows
    runner.drafter.lookup_lists = lambda ids, contexts, n: ([[] for _ in ids], [[] for _ in ids])
    _after_each_step(engine, lambda: modes.append(runner.drafter_on))
    seqs = engine.generate(prompts[:8], SamplingParams(max_tokens=24))
    for seq, ref in zip(seqs, refs[:8]):
        assert seq.output_ids == ref
    level = engine.drafter_or_lookup.levels[0]
    assert modes[0] is False  # lookup alone first
    assert level.mode == ON and level.steps[ON] > 0
    assert modes.count(True) > modes.count(False)  # most steps ran the drafter, once it won
