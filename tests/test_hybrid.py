"""Hybrid drafting: prompt lookup with calibrated confidence and the DSpark block in
one block. Exactness is checked against plain greedy decoding (itself pinned to
transformers) and, for sampling, against the exact target distribution; the lookup
pieces against hand-worked examples."""

from __future__ import annotations

import json

import pytest
import torch

from dspark.drafters.hybrid import HybridDrafter
from dspark.drafters.lookup import LookupCalibration, LookupMatch, fit_lookup_calibration, lookup
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.sampling import SamplingParams
from dspark.engine.config import SpeculativeConfig

from test_drafters import target_hidden
from test_speculative import greedy_case, tiny_target  # noqa: F401  (fixtures)


def test_lookup_takes_the_longest_match_and_the_majority_continuation():
    # "1 2 3" occurred twice, followed by 9 both times: agreed, latest occurrence wins
    assert lookup([1, 2, 3, 9, 7, 1, 2, 3, 9, 6, 1, 2, 3], 4) == LookupMatch([9, 6, 1, 2], 3, True)
    # followed by 9 and by 8 once each: contested, the latest of the tied first tokens
    assert lookup([1, 2, 3, 9, 1, 2, 3, 8, 5, 1, 2, 3], 4) == LookupMatch([8, 5, 1, 2], 3, False)
    # 9 twice, 8 once: the majority (9) wins over the latest occurrence (8)
    m = lookup([3, 9, 0, 3, 9, 1, 3, 8, 2, 3], 2, max_ngram=3)
    assert m.tokens == [9, 1] and m.ngram == 1 and not m.agreed
    # only a 1-gram matches; a continuation cut by the end of the sequence is shorter
    assert lookup([5, 4, 5], 3) == LookupMatch([4, 5], 1, True)
    assert lookup([5, 6, 7], 3) == LookupMatch()
    assert lookup([5, 6, 7], 3, min_ngram=2) == LookupMatch()


def test_calibration_counts_conditional_acceptance_and_decays():
    cal = LookupCalibration(positions=4)
    m = LookupMatch([1, 2, 3, 4], 2, True)
    cal.observe(m, verified=4, accepted=2)  # positions 1, 2 accepted, 3 rejected, 4 not a trial
    cal.observe(m, verified=1, accepted=1)
    assert cal.trials["2a"] == [2, 1, 1, 0] and cal.accepted["2a"] == [2, 1, 0, 0]
    assert cal.confidence(m) == pytest.approx([3 / 4, 2 / 3, 1 / 3, 1 / 2])
    assert cal.confidence(LookupMatch([1, 2], 3, False)) == [0.5, 0.5]  # unseen class: the prior
    cal.memory = 10.0
    for _ in range(20):
        cal.observe(m, verified=1, accepted=0)
    assert cal.trials["2a"][0] == pytest.approx(10.0) and cal.confidence(m)[0] < 0.2


def test_fit_matches_greedy_verification_of_each_proposal():
    prompt = [7, 1, 2, 3, 4, 5, 6]
    reply = [1, 2, 3, 4, 5, 9, 1, 2]
    cal = fit_lookup_calibration([(prompt, reply)], num_tokens=3, max_ngram=2)
    # by hand: anchor reply[t] at t = 0..6, proposal from prompt + reply[:t+1], compared with reply[t+1:]
    expected_trials, expected_acc = {}, {}
    seq = prompt + reply
    for t in range(len(reply) - 1):
        m = lookup(seq[: len(prompt) + t + 1], 3, 2, 1)
        fut = reply[t + 1: t + 1 + len(m.tokens)]
        if not m.tokens or not fut:
            continue
        a = next((i for i, (x, y) in enumerate(zip(m.tokens, fut)) if x != y), len(fut))
        tri = expected_trials.setdefault(m.key, [0] * 16)
        acc = expected_acc.setdefault(m.key, [0] * 16)
        for k in range(min(len(fut), a + 1)):
            tri[k] += 1
            acc[k] += k < a
    assert cal.trials == {k: [float(x) for x in v] for k, v in expected_trials.items()}
    assert cal.accepted == {k: [float(x) for x in v] for k, v in expected_acc.items()}
    # the reply copies the prompt for five tokens: agreed 1-gram/2-gram matches were accepted
    assert max(cal.confidence(LookupMatch([0], 2, True))) > 0.5


def test_calibration_file_round_trip_and_errors(tmp_path):
    from dspark.drafters.config import DrafterConfigError

    cal = LookupCalibration(positions=3, counts={"1a": [[1, 0, 0], [2, 1, 0]]}, fitted_on="x")
    back = LookupCalibration.load(cal.save(tmp_path / "c.json"))
    assert back.trials == cal.trials and back.accepted == cal.accepted and back.fitted_on == "x"
    (tmp_path / "bad.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(DrafterConfigError, match="not a lookup calibration"):
        LookupCalibration.load(tmp_path / "bad.json")
    with pytest.raises(DrafterConfigError, match="cannot read"):
        LookupCalibration.load(tmp_path / "missing.json")
    # the shipped table loads and has measured cells
    shipped = LookupCalibration.load()
    assert shipped.trials and max(t[0] for t in shipped.trials.values()) > 100


def _table(tmp_path, per_position: list[float], name: str = "cal.json") -> str:
    """A calibration whose every class has conditional acceptance `per_position`."""
    n = 1000.0
    counts = {f"{g}{a}": [[p * n for p in per_position], [n] * len(per_position)]
              for g in (1, 2, 3) for a in "ac"}
    return str(LookupCalibration(len(per_position), counts).save(tmp_path / name))


def test_hybrid_block_takes_lookup_then_drafter_with_point_mass_q(default_target_fp32, tmp_path):
    from dspark.drafters import load_drafter
    from dspark.drafters.base import DraftRequest
    from dspark.engine.config import SHIPPED_DIR

    target = default_target_fp32
    inner = load_drafter(SHIPPED_DIR / "dspark", target.model)
    seq = target.tokenizer.encode("a b c d e f a b c d e f a b c d e")
    hidden_layers = inner.target_layer_ids

    def draft_with(table: list[float]):
        cal = LookupCalibration.load(_table(tmp_path, table))
        hybrid = HybridDrafter(inner, cal)
        hybrid.reserve(1, 128)
        hybrid.add_request("r")
        hidden = target_hidden(target.model, seq[:-1], hidden_layers)
        hybrid.append_context(["r"], [seq[:-1]], [0], hidden)
        out = hybrid.draft([DraftRequest("r", seq[-1], len(seq) - 1, SamplingParams(), None)], 5)
        hybrid.release("r")
        return out, hybrid

    plain_inner = lookup(seq, 5)
    assert len(plain_inner.tokens) == 5
    # lookup far more confident than any drafter position: the whole block from lookup
    out, h = draft_with([0.999] * 7)
    assert out.tokens[0].tolist() == plain_inner.tokens and h.mix[5] == 1
    # confident for two positions only: two lookup tokens, then the drafter
    out, h = draft_with([0.999, 0.999, 0.0, 0.999, 0.999, 0.999, 0.999])
    assert out.tokens[0, :2].tolist() == plain_inner.tokens[:2] and h.mix[2] == 1
    for k in range(2):
        q = out.logits[0, k]
        assert q[out.tokens[0, k]] == 0 and torch.isinf(q).sum() == q.numel() - 1
    assert torch.isfinite(out.logits[0, 2]).sum() > 1  # the drafter's own q after the switch
    assert out.confidence[0, :2].tolist() == pytest.approx([1000 / 1002] * 2)  # Beta(1, 1)-smoothed 999/1000
    # never confident: the drafter alone
    out, h = draft_with([0.0] * 7)
    assert h.mix[0] == 1


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["fixed", "threshold", "dspark-sync", "dspark-async"])
def test_hybrid_greedy_equals_plain_under_every_policy_with_every_mix(greedy_case, policy, tmp_path):  # noqa: F811
    from dspark.schedule.step_time import StepTimeTable

    target, prompts, refs = greedy_case
    table = StepTimeTable.synthetic(base_ms=30, knee=24, per_token_ms=1.5, max_tokens=512, drafter_ms=5)
    # lookup ahead of the drafter early in the block and behind it later: every mix occurs
    cal = _table(tmp_path, [0.9, 0.8, 0.6, 0.45, 0.3, 0.2, 0.1])
    spec = SpeculativeConfig(method="dspark", num_speculative_tokens=5, verification_policy=policy,
                             confidence_threshold=0.05, lookup=True, lookup_calibration=cal)
    engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=16, max_model_len=512), step_table=table)
    seqs = engine.generate(prompts[:16], SamplingParams(max_tokens=24))
    for seq, ref in zip(seqs, refs[:16]):
        assert seq.output_ids == ref, policy
    hybrid = engine.runner.drafter
    assert isinstance(hybrid, HybridDrafter)
    if policy == "fixed":
        # drafter-only rows, short lookup prefixes and long ones (the all-lookup block is
        # covered by test_hybrid_block_takes_lookup_then_drafter_with_point_mass_q)
        assert hybrid.mix[0] > 0 and any(hybrid.mix[k] for k in (1, 2)), hybrid.mix
        assert any(hybrid.mix[k] for k in (3, 4, 5)), hybrid.mix
        assert len(hybrid.calibration.recent) > 16  # online updates arrived (cells at their memory keep 1000 trials)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["dspark-async", "threshold"])
def test_rows_left_out_of_drafting_get_lookup_alone_and_stay_exact(greedy_case, policy, tmp_path):  # noqa: F811
    # dspark-async: a drafter so slow that drafting never pays, so whole steps skip it
    # (the table as given: a live one would learn the drafter's real, far smaller cost
    # from the probes, and whether a step skips would hang on the machine's speed);
    # threshold 0.999: every drafted length is 0, so the gate leaves requests out one by one
    from dspark.schedule.step_time import StepTimeTable

    target, prompts, refs = greedy_case
    table = StepTimeTable.synthetic(base_ms=30, knee=24, per_token_ms=1.5, max_tokens=512, drafter_ms=500)
    cal = _table(tmp_path, [0.9, 0.8, 0.6, 0.45, 0.3, 0.2, 0.1])
    spec = SpeculativeConfig(method="dspark", num_speculative_tokens=5, verification_policy=policy,
                             confidence_threshold=0.999, lookup=True, lookup_calibration=cal, live_step_time=False)
    engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=16, max_model_len=512), step_table=table)
    pol = engine.runner.policy
    decisions = []  # (the policy had its lagged steps, it drafted, a probe)
    if policy == "dspark-async":
        should_draft = pol.should_draft

        def recorded(num_requests, num_drafted):
            full = len(pol._history) >= pol.lag
            drafted = should_draft(num_requests, num_drafted)
            decisions.append((full, drafted, pol.probing))
            return drafted

        pol.should_draft = recorded
    seqs = engine.generate(prompts[:16], SamplingParams(max_tokens=24))
    for seq, ref in zip(seqs, refs[:16]):
        assert seq.output_ids == ref, policy
    hybrid = engine.runner.drafter
    assert hybrid.counts["lookup_only"] > 16, hybrid.counts
    if policy == "dspark-async":
        # once `lag` drafted steps back it up, every step the policy decides leaves the
        # drafter out but a probe (where lookup wins every row, drafting over lookup prices
        # the slow drafter out before the policy is asked: how many steps it decides hangs
        # on the drafter's numbers, which differ by CPU kind)
        decided = [(drafted, probing) for full, drafted, probing in decisions if full]
        assert all(probing for drafted, probing in decided if drafted), decisions
        assert pol.skipped_steps == sum(not drafted for drafted, _ in decided), decisions
        # priced on target time alone, lookup's tokens were verified and some accepted
        assert engine.total_stats().accepted_tokens > 0
    else:
        # the threshold verifies nothing (lookup's 0.9 is below it too), so the gate holds
        # every request back and its rows are looked up instead of drafted. (A lookup
        # table sure enough to pass the threshold would fill the block inside the
        # drafter's own draft, and the gate would never close.)
        assert engine.runner.gate.skipped > 0


def test_free_lengths_take_the_best_prefix_of_the_whole_table():
    from dspark.schedule.lookup_pricing import free_lengths
    from dspark.schedule.policies import DSparkSync
    from dspark.schedule.step_time import DrafterTimeTable, StepTimeTable

    # a jagged curve: 1-2 tokens 10 ms, 3 tokens 18 ms (a dip in tokens/s), 4 tokens 19 ms
    counts, ms = [1, 2, 3, 4, 8], [10.0, 10.0, 18.0, 19.0, 40.0]
    table = StepTimeTable(token_counts=counts, raw_ms=ms)
    certain = [[1.0, 1.0, 1.0]]  # 4 tokens / 19 ms beats 2 / 10 ms: past the dip
    assert free_lengths(certain, table) == [3]
    assert DSparkSync(table).choose(certain) == [1]  # the first drop stops the sampled-draft greedy
    assert free_lengths([[0.95, 0.5, 0.4]], table) == [1]  # 1.95 / 10 ms beats 2.85 / 19 ms
    # one row with nothing to gain, one certain: only the certain row's tokens are verified
    assert free_lengths([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], table) == [0, 2]
    assert free_lengths(torch.zeros(0, 3), table) == []
    # the drafter's time is not charged: with 100 ms of drafting the same choice
    slow = StepTimeTable(token_counts=counts, raw_ms=ms,
                         drafter=DrafterTimeTable(method="x", request_counts=[1], raw_ms=[100.0]))
    assert free_lengths([[0.95, 0.5, 0.4]], slow) == [1]


def test_hybrid_sampling_distribution_matches_target(tiny_target, tmp_path):  # noqa: F811
    from test_speculative import _exact_three_token_dist, assert_three_token_distribution

    target = tiny_target
    prompt = [1, 2, 3, 1, 2, 3, 4]
    temperature = 1.3
    exact = _exact_three_token_dist(target, prompt, temperature).flatten()
    n = 5000
    cal = _table(tmp_path, [0.9, 0.5, 0.2])
    spec = SpeculativeConfig(method="dspark", model="random", num_speculative_tokens=3, lookup=True,
                             lookup_calibration=cal)
    engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=64, max_model_len=32))
    # the table's confidences as they are, so that both sources keep drafting (trust would
    # rightly drop lookup here: a random target rejects its tokens)
    engine.runner.drafter.trust.enabled = False
    engine.runner.drafter.drafter_trust.enabled = False
    seqs = engine.generate([prompt] * n, [SamplingParams(temperature=temperature, max_tokens=4, seed=i,
                                                         ignore_eos=True) for i in range(n)])
    hybrid = engine.runner.drafter
    assert hybrid.counts["lookup_tokens"] > n and hybrid.counts["drafter_tokens"] > n, hybrid.counts
    assert engine.total_stats().accepted_tokens > 0.2 * n
    assert_three_token_distribution(seqs, exact)


def test_lookup_alone_keeps_the_sampling_distribution(tiny_target, tmp_path):  # noqa: F811
    # a drafter too slow to ever pay: dspark-async skips it, and the steps draft by lookup alone
    from dspark.schedule.step_time import StepTimeTable
    from test_speculative import _exact_three_token_dist, assert_three_token_distribution

    target = tiny_target
    prompt = [1, 2, 3, 1, 2, 3, 4]
    temperature = 1.3
    exact = _exact_three_token_dist(target, prompt, temperature).flatten()
    n = 5000
    table = StepTimeTable.synthetic(base_ms=10, knee=4096, per_token_ms=0.0, max_tokens=4096, drafter_ms=1000)
    spec = SpeculativeConfig(method="dspark", model="random", num_speculative_tokens=3, lookup=True,
                             lookup_calibration=_table(tmp_path, [0.9, 0.5, 0.2]),
                             verification_policy="dspark-async", async_lag=1)
    engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=64, max_model_len=32), step_table=table)
    seqs = engine.generate([prompt] * n, [SamplingParams(temperature=temperature, max_tokens=4, seed=i,
                                                         ignore_eos=True) for i in range(n)])
    hybrid = engine.runner.drafter
    assert hybrid.counts["lookup_only"] > n, hybrid.counts
    assert engine.total_stats().accepted_tokens > 0.2 * n
    from dspark.serve.metrics import ServingMetrics

    metrics = ServingMetrics("m")
    metrics.on_engine(engine)
    line = next(x for x in metrics.render().splitlines()
                if x.startswith("dspark:spec_decode_lookup_only_requests_total"))
    assert float(line.split()[-1]) == hybrid.counts["lookup_only"]
    assert_three_token_distribution(seqs, exact)


def test_hybrid_config_errors():
    from dspark.errors import UserError

    with pytest.raises(UserError, match="not with 'eagle3'"):
        SpeculativeConfig(method="eagle3", lookup=True)
    with pytest.raises(UserError, match="drafter_trust must be true or false"):
        SpeculativeConfig(lookup=True, drafter_trust="no")
    with pytest.raises(UserError, match="lookup must be true or false"):
        SpeculativeConfig(lookup="yes")
    with pytest.raises(UserError, match="no calibrated lookup runs"):
        SpeculativeConfig(lookup_calibration="x.json")
    with pytest.raises(UserError, match="no calibrated lookup runs"):
        SpeculativeConfig(method="ngram", lookup_calibration="x.json")  # fixed verification reads no confidence
    assert SpeculativeConfig(method="ngram", enable_adaptive_verification=True, lookup_calibration="x.json").priced_lookup
    with pytest.raises(UserError, match="not with 'ngram'"):
        SpeculativeConfig(method="ngram", lookup=True)
    with pytest.raises(UserError, match="needs confidence estimates"):
        SpeculativeConfig(method="mtp", enable_adaptive_verification=True)
