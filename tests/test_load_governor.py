"""The load governor alone (dspark.engine.load_governor), on synthetic timings:
speculation runs where it measures faster than plain decoding and is turned off where
it measures slower, at a small exploration cost; the drafter against lookup alone is
the same mechanism. In a running engine: tests/test_load_governor_engine.py."""

from __future__ import annotations

import pytest

from dspark.engine.load_governor import OFF, ON, LoadGovernor, LoadLevel


def _run(gov: LoadLevel, steps: int, spec_eff, plain_eff: float = 1.0, requests: int = 16,
         spec_yield: float = 2.0, plain_yield: float = 1.0) -> list[str]:
    """Feed `steps` steps whose efficiency (vs the plain reference) is `spec_eff` (a
    number or a function of the step index) in speculative mode, emitting `spec_yield`
    tokens per request, and `plain_eff` in plain mode, emitting `plain_yield` (plain
    decoding's one; drafter_or_lookup's off mode, lookup alone, more); returns
    the mode of every step."""
    modes = []
    plain_seconds = 0.050
    for i in range(steps):
        modes.append(gov.mode)
        eff = (spec_eff(i) if callable(spec_eff) else spec_eff) if gov.on else plain_eff
        per_request = spec_yield if gov.on else plain_yield
        seconds = 0.050 * per_request / eff  # these tokens, at this efficiency
        gov.record(requests, round(requests * per_request), seconds, plain_seconds)
    return modes


def _step(gov: LoadGovernor, r: int, eff: float) -> None:
    """One step of `r` requests: speculating, two tokens each at efficiency `eff`;
    plain, one token each at efficiency 1."""
    if gov.on(r):
        gov.record(r, 2 * r, 0.10 / eff, 0.05)
    else:
        gov.record(r, r, 0.05, 0.05)


def test_speculation_that_loses_is_turned_off_and_rarely_retried():
    gov = LoadLevel(8, 16, 256, 2)
    modes = _run(gov, 4000, spec_eff=0.9)
    assert gov.score[ON] == pytest.approx(0.9) and gov.score[OFF] == pytest.approx(1.0)
    late = modes[1000:]
    assert late.count(ON) / len(late) < 0.08  # trials' speculative halves: 2 + 2 x 8 steps every 256
    assert gov.gap == 256


def test_speculation_that_wins_keeps_running():
    gov = LoadLevel(8, 16, 256, 2)
    modes = _run(gov, 4000, spec_eff=1.3)
    late = modes[1000:]
    assert late.count(OFF) / len(late) < 0.08  # trials' plain halves: 2 + 2 x 8 steps every 256
    assert gov.on


def test_a_change_of_workload_is_followed_both_ways():
    gov = LoadLevel(8, 16, 128, 2)
    modes = _run(gov, 6000, spec_eff=lambda i: 1.4 if i < 2000 or i >= 4000 else 0.7)
    for lo, hi, want in ((1000, 2000, ON), (3000, 4000, OFF), (5000, 6000, ON)):
        part = modes[lo:hi]
        assert part.count(want) / len(part) > 0.75, (lo, want)


def test_bad_settings_and_degenerate_steps():
    with pytest.raises(ValueError):
        LoadGovernor(trial=0)
    with pytest.raises(ValueError):
        LoadGovernor(min_gap=10, max_gap=5)
    gov = LoadGovernor()
    gov.record(0, 0, 0.01, 0.01)  # no requests: ignored
    gov.record(4, 4, 0.0, 0.01)  # no time: ignored
    assert gov.steps(ON) == gov.steps(OFF) == 0


def test_each_load_level_decides_for_itself():
    gov = LoadGovernor(trial=4, min_gap=8, max_gap=64, warmup=1)
    for _ in range(600):
        for r, eff in ((1, 1.4), (16, 0.8)):  # speculation pays alone, loses at 16
            lv = gov.level(r)
            _step(gov, r, eff)
    assert gov.on(1) and not gov.on(16)
    assert gov.bucket(1) == 0 and gov.bucket(3) == 1 and gov.bucket(16) == gov.bucket(31) == 4
    assert set(gov.summary()) == {"1-1", "16-31"} and gov.summary()["16-31"]["mode"] == "plain"
    assert lv is gov.level(20)


def test_a_summary_names_the_modes_its_use_chooses_between():
    """The same mechanism decides speculation against plain decoding and the drafter
    against lookup alone; each summary says which of its own two modes runs."""
    gov = LoadGovernor(trial=4, min_gap=8, max_gap=64, warmup=1, modes=("drafter", "lookup"))
    for _ in range(600):
        _step(gov, 16, 0.8)  # the ON mode (here: the drafter) loses
    level = gov.summary()["16-31"]
    assert level["mode"] == "lookup" and not gov.on(16)
    assert set(level["score"]) == set(level["steps"]) == {"drafter", "lookup"}
    assert level["steps"]["lookup"] == gov.steps(OFF) > level["steps"]["drafter"] == gov.steps(ON) > 0


def test_from_n_requests_only_the_top_levels_are_governed_and_they_start_plain():
    gov = LoadGovernor(trial=4, min_gap=8, max_gap=64, warmup=1, from_requests=32)
    assert gov.on(1) and gov.on(16) and gov.on(31)  # never governed
    assert not gov.on(32) and not gov.on(40)  # governed: plain first
    for _ in range(100):
        gov.record(16, 16, 0.05 / 0.8, 0.05)  # below the governed levels: not recorded
    assert gov.on(16) and gov.steps(ON) == 0 and set(gov.summary()) == {"32-63"}
    modes = []
    for _ in range(400):  # at 32, speculation wins: after a plain gap and a trial it runs
        modes.append(gov.level(32).mode)
        _step(gov, 32, 1.3)
    assert modes[:9] == [OFF] * 9 and gov.on(32)
    assert modes[200:].count(ON) / 200 > 0.8
    with pytest.raises(ValueError):
        LoadGovernor(from_requests=0)


def test_levels_from_trials_from_are_governed_starting_with_speculation():
    """Between `trials_from` and `from_requests` a level starts speculating and turns to
    plain decoding only once a plain trial measures faster; one that speculation wins
    keeps it; below `trials_from` nothing is governed."""
    gov = LoadGovernor(trial=4, min_gap=8, max_gap=64, warmup=1, from_requests=8, trials_from=2)
    assert gov.on(1) and gov.on(2) and gov.on(4) and not gov.on(8)
    gov.record(1, 1, 1.0, 0.05)
    assert "1-1" not in gov.summary()  # one request: never governed
    modes = {2: [], 4: []}
    for _ in range(600):  # at 2-3 requests speculation pays (1.2x), at 4-7 it loses (0.85x)
        for r, eff in ((2, 1.2), (4, 0.85)):
            modes[r].append(gov.level(r).mode)
            _step(gov, r, eff)
    assert modes[2][:8] == [ON] * 8 and modes[4][:8] == [ON] * 8  # both start speculating
    assert modes[2][300:].count(ON) / 300 > 0.8  # where it pays, it stays
    assert modes[4][300:].count(OFF) / 300 > 0.8  # where it loses, plain decoding takes over
    assert gov.level(2).steps[OFF] > 0  # the plain trials that decided it
    with pytest.raises(ValueError):
        LoadGovernor(trials_from=2)  # trials_from needs from_requests


def test_where_the_step_time_curve_says_verification_is_dear_a_level_starts_plain():
    """Below `from_requests`, a governed level starts with plain decoding when a step of
    two tokens per request costs DEAR_VERIFICATION times a plain step or more, and with
    speculation where verification is nearly free."""
    dear = {1: 10.0, 2: 10.5, 4: 11.0, 8: 16.0, 16: 24.0}  # flat to 4 tokens, then steep
    gov = LoadGovernor(trial=4, min_gap=8, max_gap=64, warmup=1, from_requests=8, trials_from=2,
                       step_cost=lambda n: dear[n])
    assert gov.on(2) and gov.on(3)  # T(4) / T(2) = 1.05: speculation first
    assert not gov.on(4) and not gov.on(7)  # T(8) / T(4) = 1.45: plain first
    assert not gov.on(8)  # from_requests: plain first, whatever the curve
    cheap = LoadGovernor(from_requests=8, trials_from=2, step_cost=lambda n: 10.0 + 0.1 * n)
    assert cheap.on(4)
    # where speculation pays after all, the trials hand it back
    modes = []
    for _ in range(400):
        modes.append(gov.level(4).mode)
        _step(gov, 4, 1.3)
    # that start rests on the curve alone: its first trial comes after the shortest gap,
    # where a level of from_requests' waits OFF_START_GAPS times longer
    assert modes[:8] == [OFF] * 8 and modes[8] == ON and modes[200:].count(ON) / 200 > 0.8
    fresh = LoadGovernor(trial=4, min_gap=8, max_gap=64, warmup=1, from_requests=8, trials_from=2,
                         step_cost=lambda n: dear[n])
    assert fresh.level(4).gap == 8 and fresh.level(8).gap == LoadLevel.OFF_START_GAPS * 8


def test_a_speculation_trial_far_behind_plain_decoding_ends_early():
    """Halfway through a trial (each mode has run as many blocks), one in which
    speculation runs below EARLY_EXIT of plain decoding's efficiency ends there; one
    merely a little behind runs its length. At a level that started plain
    (verification dear there) a trial keeps its second half only while speculation is
    level with plain decoding."""
    assert LoadLevel.EARLY_EXIT < 0.95 < LoadLevel.EARLY_EXIT_OFF_START <= 1.0
    full = LoadLevel.TRIAL_BLOCKS * 2  # blocks of 8 // 4 steps
    cases = ((ON, 0.6, full // 2), (ON, 0.95, full), (OFF, 0.6, full // 2), (OFF, 0.95, full // 2),
             (OFF, 1.01, full))
    for start, eff, length in cases:
        gov = LoadLevel(8, 16, 256, 2, start=start)
        _run(gov, gov.gap, spec_eff=eff)  # the first gap
        assert gov.trialing and gov.mode != start  # the trial starts with the other mode
        steps = 0
        while gov.trialing:
            _run(gov, 1, spec_eff=eff)
            steps += 1
        assert steps == 2 + length, (start, eff)  # warm-up, then the scored blocks
        assert gov.score[ON] == pytest.approx(eff) and gov.score[OFF] == pytest.approx(1.0)


def test_a_trial_alternates_the_modes_so_that_drift_falls_on_both():
    """The machine's speed drifts by tens of percent over minutes, more than the few
    percent a trial must resolve: a trial alternates the two modes in short blocks
    (A B B A), so that speculation 5 % behind plain decoding is not chosen however the
    drift falls, and 10 % ahead is, where runs of each mode taken one after the other
    would compare different speeds of the machine."""
    import math

    for spec_gain, want in ((0.95, OFF), (1.10, ON)):
        for phase in range(8):  # where the drift's slow wave meets the trials
            gov = LoadLevel(32, 128, 1024, 4, start=OFF)
            modes = []
            for i in range(6000):
                speed = 1.0 + 0.3 * math.sin(2 * math.pi * (i / 700 + phase / 8))
                modes.append(gov.mode)
                eff = speed * (spec_gain if gov.on else 1.0)
                per_request = 1.5 if gov.on else 1.0
                gov.record(8, round(8 * per_request), 0.05 * per_request / eff, 0.05)
            late = modes[2000:]
            assert late.count(want) / len(late) > 0.85, (spec_gain, phase)


def test_a_speculation_gap_whose_verification_costs_more_than_it_yields_ends_early():
    """A gap is not scored against plain decoding (that would compare moments apart),
    but its output over the table's time of the forwards it ran bounds its efficiency
    and does not drift: a gap of steps that verify 3 tokens per request (a forward
    twice a plain one's, by the table) for 1.5 tokens each ends after a window of
    2 x `trial` steps; one that emits 2.5 tokens for the same forward runs its length."""
    for emitted, ends_early in ((1.5, True), (2.5, False)):
        gov = LoadLevel(8, 64, 256, 2)  # starts with a speculation gap of 64 steps
        modes = []
        for _ in range(40):
            modes.append(gov.mode)
            # wall time says speculation wins (drift can say anything); the table says otherwise
            gov.record(4, round(4 * emitted), 0.01, 0.05, forward_seconds=0.10)
        if ends_early:
            assert modes[:16] == [ON] * 16 and modes[16:] == [OFF] * 24 and gov.gap_exits == 1
            assert gov.gap == 64 and not gov.trialing  # plain decoding's shortest gap
        else:
            assert modes == [ON] * 40 and gov.gap_exits == 0
    plain_steps = LoadLevel(8, 64, 256, 2, start=OFF)
    for _ in range(40):
        plain_steps.record(4, 4, 0.05, 0.05, forward_seconds=0.05)
    assert plain_steps.gap_exits == 0 and plain_steps.mode == OFF


def test_a_level_that_starts_plain_waits_longer_for_its_first_trial():
    """Where verification is dear (a level that starts plain), the first gap is
    OFF_START_GAPS times the shortest, as if plain decoding had won that many trials
    already: a burst shorter than that never pays for a trial; a losing trial doubles
    the gap from there, and a winning one hands speculation the level as usual."""
    k = LoadLevel.OFF_START_GAPS
    assert k > 1
    half = LoadLevel.TRIAL_BLOCKS  # a trial's first half: TRIAL_BLOCKS / 2 blocks of 2 steps
    gov = LoadLevel(8, 16, 1024, 2, start=OFF)
    modes = _run(gov, 16 * k + 2 + half, spec_eff=0.7)  # the gap, then a trial that ends halfway
    assert modes[: 16 * k] == [OFF] * (16 * k) and modes[16 * k] == ON and not gov.trialing
    assert gov.gap == 2 * 16 * k  # plain won again: the gap doubled from the longer one
    assert LoadLevel(8, 16, 32, 2, start=OFF).gap == 32  # never past max_gap
    assert LoadLevel(8, 16, 1024, 2).gap == 16  # a level that starts speculating: the shortest
    win = LoadLevel(8, 16, 1024, 2, start=OFF)
    modes = _run(win, 16 * k + 2 + 2 * half + 400, spec_eff=1.4)
    assert modes[-300:].count(ON) / 300 > 0.8


def test_speculation_must_beat_plain_decoding_by_a_margin():
    """Level with plain decoding (within ON_MARGIN), a level decodes plain: speculation's
    variance is not worth a percent; clearly ahead, it speculates."""
    assert LoadLevel.ON_MARGIN > 1.0
    for eff, want in ((1.01, OFF), (1.06, ON)):
        gov = LoadLevel(8, 16, 256, 2)
        late = _run(gov, 4000, spec_eff=eff)[1000:]
        assert late.count(want) / len(late) > 0.85, eff


def test_speculation_that_emits_no_more_tokens_than_plain_decoding_is_never_chosen():
    """A step that verifies drafted tokens never costs less than a plain one, so a
    speculation trial's tokens per request and step bound its gain; scored ahead of
    plain decoding but emitting no more tokens, speculation is not chosen."""
    for spec_yield, want in ((1.0, OFF), (1.01, OFF), (1.5, ON)):  # ON_MARGIN 1.02
        gov = LoadLevel(8, 16, 256, 2)
        late = _run(gov, 4000, spec_eff=1.3, requests=100, spec_yield=spec_yield)[1000:]
        assert late.count(want) / len(late) > 0.85, spec_yield
        assert gov.on_yield == pytest.approx(spec_yield)


def test_a_drafter_that_emits_no_more_tokens_than_lookup_alone_is_never_chosen():
    """drafter_or_lookup's off mode (lookup alone) emits more than a token per
    request and step; the drafter's yield must beat that one by ON_MARGIN, since a
    step that drafts rarely costs less than one that only looks up. Scored ahead (a
    trial's timing noise) but emitting no more tokens, the drafter is not chosen."""
    for spec_yield, want in ((1.3, OFF), (1.32, OFF), (1.5, ON)):  # 1.32 < 1.02 x 1.3
        gov = LoadLevel(8, 16, 256, 2, start=OFF)
        late = _run(gov, 4000, spec_eff=1.4, plain_eff=1.3, requests=100, spec_yield=spec_yield,
                    plain_yield=1.3)[1000:]
        assert late.count(want) / len(late) > 0.85, spec_yield


def test_a_score_weighs_a_modes_earlier_trials_by_history():
    """A mode's score is its trials' decayed output over their decayed time, so one
    lucky trial moves it only part of the way."""
    gov = LoadLevel(4, 8, 8, 0, start=OFF)
    trial = [ON, OFF, OFF, ON] * (LoadLevel.TRIAL_BLOCKS // 4)  # blocks of one step, A B B A
    modes = _run(gov, 8 + len(trial), spec_eff=1.0)  # the plain gap, a trial
    assert modes == [OFF] * 8 + trial and gov.score[ON] == pytest.approx(1.0)
    modes = _run(gov, 8 + len(trial), spec_eff=1.6)  # plain won: its gap; then a lucky trial
    assert modes == [OFF] * 8 + trial
    h = LoadLevel.HISTORY
    assert 0 < h < 1
    n = len(trial) // 2  # each mode's steps in a trial
    assert gov.score[ON] == pytest.approx((h * n + n) / (h * n / 1.0 + n / 1.6))
    assert gov.score[ON] < 1.6


def test_the_default_configuration_governs_from_2_requests():
    from dspark.engine.config import DEFAULT_SPECULATIVE, SpeculativeConfig
    from dspark.errors import UserError

    cfg = SpeculativeConfig.from_dict(DEFAULT_SPECULATIVE)
    assert cfg.plain_fallback == 8 and cfg.plain_trials_from == 2
    assert SpeculativeConfig(method="dspark", plain_fallback=8, plain_trials_from=2).plain_trials_from == 2
    for bad in (0, -1, True, 2.0):
        with pytest.raises(UserError, match="plain_trials_from"):
            SpeculativeConfig(method="dspark", plain_fallback=8, plain_trials_from=bad)
    for pf in (False, True, 2):  # needs a larger plain_fallback
        with pytest.raises(UserError, match="plain_trials_from"):
            SpeculativeConfig(method="dspark", plain_fallback=pf, plain_trials_from=2)
    for bad in (0, -4, "yes", 2.5):
        with pytest.raises(UserError, match="plain_fallback"):
            SpeculativeConfig(method="dspark", plain_fallback=bad)
