"""Prompt lookup priced by the scheduler (`{"method": "ngram", "enable_adaptive_verification":
true}`): calibrated confidences, no drafter block, each request's length chosen on the
target's step time. Exactness against plain greedy decoding (itself pinned to
transformers) and against the exact sampling distribution; the pricing against what a
calibration says."""

from __future__ import annotations

import pytest

from dspark.drafters.priced_lookup import LookupDrafter
from dspark.engine.config import SpeculativeConfig
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.sampling import SamplingParams

from test_hybrid import _table
from test_speculative import greedy_case, tiny_target  # noqa: F401  (fixtures)


def _synthetic():
    from dspark.schedule.step_time import StepTimeTable

    return StepTimeTable.synthetic(base_ms=30, knee=24, per_token_ms=1.5, max_tokens=512)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["dspark-async", "dspark-sync", "threshold"])
def test_priced_lookup_greedy_equals_plain(greedy_case, policy, tmp_path):  # noqa: F811
    target, prompts, refs = greedy_case
    cal = _table(tmp_path, [0.9, 0.8, 0.6, 0.45, 0.3, 0.2, 0.1])
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=5, verification_policy=policy,
                             confidence_threshold=0.3, lookup_calibration=cal)
    engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=16, max_model_len=512), step_table=_synthetic())
    seqs = engine.generate(prompts[:16], SamplingParams(max_tokens=24))
    for seq, ref in zip(seqs, refs[:16]):
        assert seq.output_ids == ref, policy
    drafter = engine.runner.drafter
    assert isinstance(drafter, LookupDrafter) and not engine.runner.drafts_block
    assert engine.runner.feed is None  # no drafter context to carry: lookup reads the tokens
    assert drafter.counts["lookup_only"] > 16 and drafter.counts["lookup_tokens"] > 0, drafter.counts
    stats = engine.total_stats()
    assert stats.accepted_tokens > 0 and stats.draft_tokens > stats.accepted_tokens  # some verified, some rejected
    assert len(drafter.calibration.recent) > 0  # online updates arrived
    assert drafter.num_requests() == 0  # every request released


def test_priced_lookup_keeps_the_sampling_distribution(tiny_target, tmp_path):  # noqa: F811
    from test_speculative import _exact_three_token_dist, assert_three_token_distribution

    target = tiny_target
    prompt = [1, 2, 3, 1, 2, 3, 4]
    temperature = 1.3
    exact = _exact_three_token_dist(target, prompt, temperature).flatten()
    n = 5000
    from dspark.schedule.step_time import StepTimeTable

    # a flat step-time curve: every verified token is free, so lookup's are verified
    table = StepTimeTable.synthetic(base_ms=10, knee=4096, per_token_ms=0.0, max_tokens=4096)
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3, enable_adaptive_verification=True,
                             lookup_calibration=_table(tmp_path, [0.9, 0.8, 0.7]))
    engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=64, max_model_len=32), step_table=table)
    engine.runner.drafter.trust.enabled = False  # a random target rejects lookup: keep verifying it
    seqs = engine.generate([prompt] * n, [SamplingParams(temperature=temperature, max_tokens=4, seed=i,
                                                         ignore_eos=True) for i in range(n)])
    assert engine.runner.drafter.counts["lookup_tokens"] > n
    assert engine.total_stats().accepted_tokens > 0.2 * n
    assert_three_token_distribution(seqs, exact)


def test_the_calibration_sets_how_much_is_verified(default_target_fp32, tmp_path):
    # The same repetitive prompt: a calibration sure of lookup verifies long proposals, one
    # that gives it no chance verifies nothing, and both decode what plain decoding does.
    from dspark.schedule.step_time import StepTimeTable

    target = default_target_fp32
    prompt = target.tokenizer.chat_prompt("Copy this list exactly: apple, banana, cherry, date, elderberry, fig, "
                                          "grape, apple, banana, cherry, date, elderberry, fig, grape.")
    plain = LLMEngine(target, None, EngineConfig(max_num_seqs=1, max_model_len=256))
    ref = plain.generate([prompt], SamplingParams(max_tokens=40, ignore_eos=True))[0].output_ids
    verified = {}
    for name, conf in (("sure", [0.99] * 7), ("hopeless", [0.01] * 7)):
        # every verified token costs 5 % of a step, on a curve the engine's own timings do
        # not move (on a flat one, a lookup token at 1 % would pay whenever speculation's
        # measured overhead came out small)
        spec = SpeculativeConfig(method="ngram", num_speculative_tokens=7, enable_adaptive_verification=True,
                                 lookup_calibration=_table(tmp_path, conf, f"{name}.json"), live_step_time=False)
        table = StepTimeTable.synthetic(base_ms=30, knee=1, per_token_ms=1.5, max_tokens=512)
        engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=1, max_model_len=256), step_table=table)
        engine.runner.drafter.trust.enabled = False
        assert engine.generate([prompt], SamplingParams(max_tokens=40, ignore_eos=True))[0].output_ids == ref, name
        verified[name] = engine.total_stats().draft_tokens
        # the server's metrics carry lookup's counters, as for the hybrid
        from dspark.serve.metrics import ServingMetrics

        metrics = ServingMetrics("m")
        metrics.on_engine(engine)
        line = next(x for x in metrics.render().splitlines()
                    if x.startswith("dspark:spec_decode_lookup_only_requests_total"))
        assert float(line.split()[-1]) == engine.runner.drafter.counts["lookup_only"] > 0
    assert verified["hopeless"] == 0 and verified["sure"] > 20, verified


def test_priced_lookup_drafts_over_its_own_history():
    # `draft` (outside the engine): lookup over the context given, with the table's confidences
    from dspark.drafters.base import DraftRequest
    from dspark.drafters.lookup import LookupCalibration, lookup

    d = LookupDrafter(LookupCalibration(4, {"3a": [[900, 800, 700, 600], [1000] * 4]}), max_draft_tokens=4)
    seq = [5, 1, 2, 3, 9, 8, 7, 1, 2]
    d.add_request("r")
    d.append_context(["r"], [seq], [0])
    out = d.draft([DraftRequest("r", 3, len(seq), SamplingParams(), None)], 4)
    assert out.tokens[0].tolist() == lookup(seq + [3], 4).tokens == [9, 8, 7, 1]
    assert out.confidence[0].tolist() == pytest.approx([901 / 1002, 801 / 1002, 701 / 1002, 601 / 1002])
    assert out.logits is None and int(out.num_valid[0]) == 4
    with pytest.raises(ValueError, match="anchor at position"):
        d.draft([DraftRequest("r", 3, 4, SamplingParams(), None)], 4)
    d.release("r")
    assert d.num_requests() == 0
