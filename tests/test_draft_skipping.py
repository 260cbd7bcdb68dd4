"""A step that skips drafting costs what a plain step costs: the drafter is not fed on
skipped steps and catches up in one call when it drafts again, and requests the
scheduler keeps verifying nothing for leave the drafter's batch (DraftGate). Both
keep greedy output equal to plain decoding, and the catch-up gives the drafter
exactly the context it would have had if fed every step."""

from __future__ import annotations

from dspark.drafters.checkpoint import load_drafter
from dspark.engine.config import SHIPPED_DIR
from dspark.engine.draft_gate import DraftGate
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.engine.runner import SpecRunner
from dspark.generate import generate_plain
from dspark.sampling import SamplingParams
from dspark.schedule.policies import VerifyLengthPolicy

from test_generate import PROMPTS


class Recording:
    """Wraps a drafter: counts its calls and keeps every draft by (the request's
    arrival index, anchor position)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.appends = 0
        self.drafted_requests = 0
        self.drafts: dict[tuple, list[int]] = {}
        self.requests: list[object] = []  # in the order they were added

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def add_request(self, request_id):
        self.requests.append(request_id)
        return self.inner.add_request(request_id)

    def append_context(self, *args):
        self.appends += 1
        return self.inner.append_context(*args)

    def draft(self, requests, num_tokens):
        out = self.inner.draft(requests, num_tokens)
        self.drafted_requests += len(requests)
        for r, toks in zip(requests, out.tokens.tolist()):
            self.drafts[(self.requests.index(r.request_id), r.anchor_position)] = toks
        return out


class DraftEvery(VerifyLengthPolicy):
    """Drafts on every `every`-th step only; verifies `length` tokens (0 = none)."""

    name = "every"
    needs_confidence = False

    def __init__(self, every: int, length: int) -> None:
        self.every, self.length, self.calls = every, length, 0

    def should_draft(self, num_requests: int, num_drafted: int) -> bool:
        self.calls += 1
        return self.calls % self.every == 0

    def choose(self, survival):
        return [self.length] * survival.shape[0]


def _run(target, prompts, policy, max_tokens=20):
    drafter = Recording(load_drafter(SHIPPED_DIR / "dspark", target.model))
    engine = LLMEngine(target, None, EngineConfig(max_num_seqs=4, max_model_len=512))
    engine.runner = SpecRunner(target.model, target.new_cache(4, 512), drafter, policy, 4)
    outs = [s.output_ids for s in engine.generate(prompts, SamplingParams(max_tokens=max_tokens))]
    return outs, drafter, engine.runner


def test_skipped_steps_feed_nothing_and_the_drafter_catches_up_exactly(default_target_fp32):
    target = default_target_fp32
    prompts = [target.tokenizer.chat_prompt(p) for p in PROMPTS[:3]]
    plain = [generate_plain(target, p, SamplingParams(max_tokens=20)).token_ids for p in prompts]
    every, every_drafter, _ = _run(target, prompts, DraftEvery(1, 2))
    sparse, sparse_drafter, _ = _run(target, prompts, DraftEvery(3, 2))
    assert every == plain and sparse == plain
    # fed once per drafting step (a catch-up call), not once per step
    assert 0 < sparse_drafter.appends < every_drafter.appends
    assert sparse_drafter.drafted_requests > 0
    # where both runs drafted at the same anchor, the drafter saw the same context
    common = set(every_drafter.drafts) & set(sparse_drafter.drafts)
    assert len(common) >= 5
    for key in common:
        assert sparse_drafter.drafts[key] == every_drafter.drafts[key], key


def test_requests_verified_for_nothing_leave_the_drafter_batch(default_target_fp32):
    target = default_target_fp32
    prompts = [target.tokenizer.chat_prompt(p) for p in PROMPTS[:2]]
    plain = [generate_plain(target, p, SamplingParams(max_tokens=24)).token_ids for p in prompts]
    outs, drafter, runner = _run(target, prompts, DraftEvery(1, 0), max_tokens=24)
    assert outs == plain
    # without the gate every decode step would draft both requests (~46 request-steps);
    # with it: 3 steps each before the gate closes, then probes after 4, 8, 16 steps
    assert 6 <= drafter.drafted_requests <= 12
    assert runner.gate.skipped >= 2 * drafter.drafted_requests


def test_draft_gate_backs_off_and_resets():
    gate = DraftGate(patience=2, probe_gap=2, max_gap=4)
    pattern = []
    for _ in range(11):
        drafted = gate.wants_draft("r")
        pattern.append(drafted)
        if drafted:
            gate.record("r", 0)
    # two zero steps, then a probe after 2 steps, then after 4, then 4 again
    assert pattern == [True, True, False, True, False, False, False, True, False, False, False]
    assert gate.skipped == 7
    assert gate.wants_draft("r")  # the next probe verifies something: back to every step
    gate.record("r", 3)
    assert all(gate.wants_draft("r") for _ in range(3))
    gate.release("r")
    assert gate.wants_draft("r") and gate.skipped == 7


def test_requests_whose_lookup_never_pays_leave_the_lookup_rows(default_target_fp32):
    """Hybrid drafting where verification is far too dear for any lookup token to pay:
    the scheduler verifies none of them, so after a few steps each request is left out
    of prompt lookup too and only probed; the output stays plain decoding's."""
    from dspark.engine.config import SpeculativeConfig
    from dspark.schedule.step_time import StepTimeTable

    from dspark.engine.draft_choice import LOOKUP_GATE_FROM

    target = default_target_fp32
    n = LOOKUP_GATE_FROM  # the gate holds requests back from this many decoding requests
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    prompts = [target.tokenizer.chat_prompt(p) for p in (PROMPTS * n)[:n]]
    plain = [generate_plain(target, p, params).token_ids for p in prompts]
    steep = StepTimeTable.synthetic(base_ms=10, knee=1, per_token_ms=1000, max_tokens=4096, drafter_ms=1000)
    spec = SpeculativeConfig(method="dspark", lookup=True, enable_adaptive_verification=True, live_step_time=False)
    for batch in (prompts, prompts[: n - 1]):
        engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=n, max_model_len=512), step_table=steep)
        hybrid = engine.runner.drafter
        looked = []
        real = hybrid.lookup_lists
        hybrid.lookup_lists = lambda ids, *a: looked.append(len(ids)) or real(ids, *a)
        outs = [s.output_ids for s in engine.generate(batch, params)]
        assert outs == plain[: len(batch)]
        assert engine.total_stats().accepted_tokens == 0
        if len(batch) >= n:
            # 23 request-steps each without the gate: 3 before it closes, then probes
            assert n <= sum(looked) <= 7 * n, looked
            assert engine.runner.lookup_gate.skipped >= 2 * sum(looked)
        else:  # fewer requests: every one looks up on every step it is not drafted for
            drafted = hybrid.counts["requests"] - hybrid.counts["lookup_only"]
            assert sum(looked) + drafted == 23 * len(batch) and sum(looked) > drafted, (looked, drafted)
            assert engine.runner.lookup_gate.skipped == 0


def test_prompt_lookup_drafter_is_gated_only_from_lookup_gate_from(default_target_fp32):
    """The n-gram drafter costs about a lookup a request: below LOOKUP_GATE_FROM decoding
    requests every request looks up on every step (the gate's closed stretches missed
    copies there); from it on, requests whose lookups keep verifying nothing are held
    back. Output is plain decoding's either way."""
    from dspark.engine.config import SpeculativeConfig
    from dspark.engine.draft_choice import LOOKUP_GATE_FROM

    target = default_target_fp32
    n = LOOKUP_GATE_FROM
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    prompts = [target.tokenizer.chat_prompt(p) for p in (PROMPTS * n)[:n]]
    plain = [generate_plain(target, p, params).token_ids for p in prompts]
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3)
    skipped = {}
    for batch in (prompts[:1], prompts):
        engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=n, max_model_len=512))
        assert [s.output_ids for s in engine.generate(batch, params)] == plain[: len(batch)]
        skipped[len(batch)] = engine.runner.gate.skipped
    assert skipped[1] == 0 and skipped[n] > 0, skipped
