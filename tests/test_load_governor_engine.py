"""The load governors in a running engine (dspark.engine.load_governor): output stays
exact while speculate_or_plain switches, plain-mode steps tap nothing, prompts admitted
together start at their own level, prompt lookup alone is governed, and an engine that
cannot reach a governed level measures no step-time table. The mechanism alone, on
synthetic timings: tests/test_load_governor.py."""

from __future__ import annotations

import pytest

from dspark.engine.load_governor import OFF, ON, LoadGovernor
from test_speculative import greedy_case, tiny_target  # noqa: F401  (fixtures)


@pytest.mark.slow
def test_the_engine_is_exact_while_the_governor_switches(greedy_case):  # noqa: F811
    from dspark.sampling import SamplingParams
    from test_live_step_time import adaptive_hybrid_engine

    target, prompts, refs = greedy_case
    engine, _ = adaptive_hybrid_engine(target)
    engine.speculate_or_plain = LoadGovernor(trial=2, min_gap=2, max_gap=4, warmup=1)  # switch often
    seqs = engine.generate(prompts[:8], SamplingParams(max_tokens=24))
    for seq, ref in zip(seqs, refs[:8]):
        assert seq.output_ids == ref
    gov = engine.speculate_or_plain
    assert gov.switches >= 3 and gov.steps(ON) > 0 and gov.steps(OFF) > 0
    assert engine.total_stats().accepted_tokens > 0  # speculation did run in its stretches


def test_a_backlog_full_while_the_fallback_decodes_plain_is_dropped_not_fed():
    import torch

    from dspark.engine import context_feed
    from dspark.engine.context_feed import ContextFeed

    class Drafter:
        fed: list = []

        def append_context(self, ids, tokens, starts, hidden):
            self.fed.append((list(ids), [len(t) for t in tokens]))

    feeding = [True]
    drafter = Drafter()
    feed = ContextFeed(drafter, torch.device("cpu"), set(), lambda where: None, set(), lambda: feeding[0])
    n = context_feed.PENDING_FLUSH
    hidden = torch.zeros(2 * n, 2, 4)
    # speculating: a backlog that reaches the bound is fed to the drafter
    feed.stash(["a", "b"], [[1] * n, [2] * (n - 1)], [0, 0], list(range(2 * n - 1)), hidden)
    assert drafter.fed == [(["a"], [n])] and feed.pending_tokens == {"b": n - 1}
    # decoding plain by the fallback's call: the full backlog is let go, its request is lookup-only
    feeding[0] = False
    feed.stash(["a", "b"], [[1], [2]], [n, n - 1], [0, 1], hidden)
    assert drafter.fed == [(["a"], [n])] and "b" not in feed.pending and feed.contextless == {"b"}
    feed.stash(["a", "b"], [[1], [2]], [n + 1, n], [0, 1], hidden)  # no new backlog for it
    assert "b" not in feed.pending and feed.pending_tokens["a"] == 2


@pytest.mark.slow
def test_plain_mode_steps_tap_nothing_and_their_requests_stay_exact_on_lookup(greedy_case):  # noqa: F811
    from dspark.sampling import SamplingParams
    from test_live_step_time import adaptive_hybrid_engine

    target, prompts, refs = greedy_case
    engine, _ = adaptive_hybrid_engine(target)
    # every load governed, plain first, then speculation trials: the requests of the plain
    # stretches let the drafter go and go on with lookup alone
    engine.speculate_or_plain = LoadGovernor(trial=2, min_gap=2, max_gap=4, warmup=1, from_requests=1)
    runner, seen, taps = engine.runner, set(), []
    model, inner = runner.model, engine.step

    def forward(batch, cache, layers):
        taps.append((runner.speculating, list(layers)))
        return model(batch, cache, layers)

    def step():
        out = inner()
        seen.update(runner.contextless)
        return out

    runner.model, engine.step = forward, step
    seqs = engine.generate(prompts[:8], SamplingParams(max_tokens=24))
    for seq, ref in zip(seqs, refs[:8]):
        assert seq.output_ids == ref
    assert seen and engine.speculate_or_plain.steps(ON) > 0
    assert {tuple(layers) for spec, layers in taps if not spec} == {()}  # plain mode: no hidden states
    assert {tuple(layers) for spec, layers in taps if spec} == {tuple(runner.hidden_layers)}
    assert runner.hidden_layers and engine.total_stats().accepted_tokens > 0  # lookup still served
    assert not runner.contextless  # released with their requests


@pytest.mark.slow
def test_prompts_admitted_together_start_at_their_own_level(greedy_case):  # noqa: F811
    """Prompts that arrive while nothing decodes (the previous batch finished together)
    are admitted at the level they will decode at: here plain, so no hidden states are
    tapped for a drafter that plain decoding would let go."""
    from dspark.sampling import SamplingParams
    from test_live_step_time import adaptive_hybrid_engine

    target, prompts, refs = greedy_case
    engine, _ = adaptive_hybrid_engine(target)
    engine.speculate_or_plain = LoadGovernor(trial=2, min_gap=64, max_gap=64, warmup=1, from_requests=4)
    runner, calls = engine.runner, []
    model = runner.model

    def forward(batch, cache, layers):
        calls.append((runner.speculating, list(layers)))
        return model(batch, cache, layers)

    runner.model = forward
    seqs = engine.generate(prompts[:4], SamplingParams(max_tokens=8))
    for seq, ref in zip(seqs, refs[:4]):
        assert seq.output_ids == ref[:8]
    assert calls[0] == (False, [])  # the prefill of all four: their level (4-7) starts plain


@pytest.mark.slow
def test_prompt_lookup_alone_is_governed_and_exact(greedy_case):  # noqa: F811
    """`plain_fallback` with prompt lookup's fixed verification: the engine measures the
    step-time table the governor scores with (it used to build none, and the setting did
    nothing), and output stays plain decoding's while the governor switches."""
    from dspark.engine.config import SpeculativeConfig
    from dspark.engine.engine import EngineConfig, LLMEngine
    from dspark.sampling import SamplingParams

    target, prompts, refs = greedy_case
    engine = LLMEngine(target, SpeculativeConfig(method="ngram", plain_fallback=True),
                       EngineConfig(max_num_seqs=4, max_model_len=512))
    assert engine.speculate_or_plain is not None and engine.step_table is not None
    engine.speculate_or_plain = LoadGovernor(trial=2, min_gap=2, max_gap=4, warmup=1)  # switch often
    seqs = engine.generate(prompts[:8], SamplingParams(max_tokens=24))
    for seq, ref in zip(seqs, refs[:8]):
        assert seq.output_ids == ref
    gov = engine.speculate_or_plain
    assert gov.switches >= 2 and gov.steps(ON) > 0 and gov.steps(OFF) > 0


def test_an_engine_that_cannot_reach_a_governed_level_measures_no_table(default_target_fp32, monkeypatch):
    """`dspark generate` runs one request: prompt lookup with fixed lengths, governed
    from 2 requests, must not profile the target's step time there (a minute on a
    larger model's first use); an engine of 4 requests does. The default for a target
    without a drafter prices its lengths, which needs the table at one request too."""
    from dspark.engine import engine as engine_module
    from dspark.engine.config import LOOKUP_DEFAULT, SpeculativeConfig
    from dspark.engine.engine import EngineConfig, LLMEngine
    from dspark.profiling import tables

    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3, plain_fallback=2)
    gov = engine_module._speculate_or_plain
    assert not gov(spec).governs(1) and gov(spec).governs(2)
    assert gov(SpeculativeConfig.from_dict(LOOKUP_DEFAULT)).governs(2)
    assert gov(SpeculativeConfig(method="ngram", plain_fallback=True)).governs(1)
    assert gov(SpeculativeConfig(method="ngram")) is None
    assert gov(SpeculativeConfig(method="dspark", plain_fallback=8, plain_trials_from=2)).governs(2)
    assert not gov(SpeculativeConfig(method="dspark", plain_fallback=8)).governs(4)
    from dspark.schedule.step_time import StepTimeTable

    profiled = []
    flat = StepTimeTable(token_counts=[1, 8, 64], raw_ms=[10.0, 12.0, 40.0])
    monkeypatch.setattr(tables, "load_or_profile", lambda *a, **k: profiled.append(a) or flat)
    one = LLMEngine(default_target_fp32, spec, EngineConfig(max_num_seqs=1, max_model_len=256))
    assert not profiled and one.speculate_or_plain is None and one.step_table is None
    LLMEngine(default_target_fp32, spec, EngineConfig(max_num_seqs=4, max_model_len=256))
    assert len(profiled) == 1
    priced = LLMEngine(default_target_fp32, SpeculativeConfig.from_dict(LOOKUP_DEFAULT),
                       EngineConfig(max_num_seqs=1, max_model_len=256))
    assert len(profiled) == 2 and priced.step_table is not None
