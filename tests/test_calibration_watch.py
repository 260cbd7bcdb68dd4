"""Serving-time calibration tracking: the drafter's confidences against what
verification finds, per position, with a drift warning, and in /metrics."""

from __future__ import annotations

import logging
import random

import pytest

from dspark.engine.calibration_watch import CalibrationWatch


def feed(watch: CalibrationWatch, rounds: int, predicted: float, true_rate: float, seed: int = 0) -> None:
    """Rounds of 4 drafted tokens with confidence `predicted`, each accepted with
    probability `true_rate` given the earlier ones were."""
    rng = random.Random(seed)
    for _ in range(rounds):
        a = 0
        while a < 4 and rng.random() < true_rate:
            a += 1
        watch.observe([[predicted] * 4, None], [4, 0], [a, 0])


def test_calibrated_confidences_have_a_small_ece_and_per_position_rates():
    watch = CalibrationWatch()
    feed(watch, 3000, predicted=0.7, true_rate=0.7)
    assert watch.ece() < 0.03
    pos = watch.per_position()
    assert set(pos) == {0, 1, 2, 3}
    for k, (pred, obs, n) in pos.items():
        assert pred == pytest.approx(0.7) and obs == pytest.approx(0.7, abs=0.06) and n > 0
    # position k is a trial only when the k tokens before it were accepted
    assert pos[0][2] == 3000 and pos[1][2] < pos[0][2]


def test_drifted_confidences_warn(caplog):
    watch = CalibrationWatch()
    watch.min_samples = 500
    assert watch.ece() != watch.ece()  # NaN before any verified token
    with caplog.at_level(logging.WARNING, logger="dspark.engine"):
        feed(watch, 1000, predicted=0.9, true_rate=0.4)
    assert watch.ece() > 0.3 and watch.warnings == 1  # once, then rate-limited
    assert "drifted" in caplog.text and "dspark calibrate" in caplog.text


def test_engine_tracks_its_drafters_calibration(default_target_fp32):
    """A real engine with a drafter whose confidence is a constant 0.9: the watch
    sees every verified position, and /metrics renders the ECE and the rates."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_drafter_faults import Faulty

    from dspark.engine.engine import EngineConfig, LLMEngine
    from dspark.engine.runner import SpecRunner
    from dspark.sampling import SamplingParams
    from dspark.schedule.policies import FixedLength
    from dspark.serve.metrics import ServingMetrics

    target = default_target_fp32
    engine = LLMEngine(target, None, EngineConfig(max_num_seqs=2, max_model_len=256))
    engine.runner = SpecRunner(target.model, engine.runner.cache, Faulty(target.cfg.vocab_size, "none"),
                               FixedLength(5), 5)
    prompts = [target.tokenizer.chat_prompt("Repeat after me: one two three, one two three, one two three.")]
    engine.generate(prompts, SamplingParams(temperature=0, max_tokens=24))
    watch = engine.runner.calibration
    stats = engine.total_stats()
    # every accepted draft token is one hit; each round adds at most one miss
    hits = sum(y for _, _, y in watch.recent)
    assert stats.rounds > 0 and hits == stats.accepted_tokens
    assert stats.accepted_tokens <= watch.observed <= stats.accepted_tokens + stats.rounds
    pos = watch.per_position()
    assert pos[0][0] == pytest.approx(0.9) and 0 <= pos[0][1] <= 1
    metrics = ServingMetrics("m")
    metrics.on_engine(engine)
    text = metrics.render()
    assert "dspark:spec_decode_calibration_ece{" in text
    line = next(x for x in text.splitlines()
                if x.startswith('dspark:spec_decode_predicted_acceptance{model_name="m",position="0"} '))
    assert float(line.split()[-1]) == pytest.approx(0.9)
    assert 'dspark:spec_decode_observed_acceptance{model_name="m",position="0"}' in text
