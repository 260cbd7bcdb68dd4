"""Each request's trust in prompt lookup (`RequestTrust`): the calibrated confidences
scaled by what the workload and the request itself had accepted, and the drafted tokens'
survivals a step prices with them (exactness stays the engine's: the same tokens)."""

from __future__ import annotations

import pytest
import torch

from dspark.drafters.lookup import LookupMatch
from dspark.engine.config import SpeculativeConfig
from dspark.engine.engine import EngineConfig, LLMEngine

from test_speculative import greedy_case  # noqa: F401  (a fixture)


def test_trust_scales_lookup_confidence_to_the_workload_and_to_each_request():
    from dspark.drafters.hybrid import RequestTrust

    trust = RequestTrust()
    assert trust.adjust("a", [0.8, 0.6]) == [0.8, 0.6]  # nothing observed: the table's word
    # the workload: tokens predicted at 0.8 accepted half as often, over many requests
    for i in range(400):
        trust.observe(("w", i), [0.8], verified=1, accepted=int(i % 5 < 2))  # 40 % accepted
        trust.release(("w", i))
    # accepted / predicted is 0.5, shrunk by the prior: (0.4 S + 10) / (0.8 S + 10), S = 200
    assert trust.workload_factor() == pytest.approx(90 / 170, abs=0.02)
    assert trust.adjust("new", [0.8]) == [pytest.approx(0.8 * 90 / 170, abs=0.02)]
    # one request whose lookup keeps working, one where it never does
    for _ in range(20):
        trust.observe("copy", [0.8, 0.8, 0.8], verified=3, accepted=3)
        trust.observe("essay", [0.8], verified=1, accepted=0)
    assert trust.factor("copy") > 1.5 * trust.workload_factor()
    assert trust.factor("essay") < 0.4 * trust.workload_factor()
    assert max(trust.adjust("copy", [0.99, 0.9])) <= RequestTrust.cap
    # without new evidence a request drifts back to the workload's factor
    for _ in range(300):
        trust.adjust("essay", [0.8])
    assert trust.factor("essay") == pytest.approx(trust.workload_factor(), rel=0.05)
    trust.release("copy")
    assert trust.factor("copy") == pytest.approx(trust.workload_factor())


def test_a_rejected_lookup_lowers_that_requests_next_confidences(greedy_case):  # noqa: F811
    target, prompts, _ = greedy_case
    spec = SpeculativeConfig(method="dspark", model="random", num_speculative_tokens=4, lookup=True)
    engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=2, max_model_len=512))
    hybrid = engine.runner.drafter
    match = LookupMatch([5, 6, 7, 8], 3, True)
    table = hybrid.calibration.confidence(match)
    hybrid._last["r"] = (match, 4, table, table, [])
    hybrid.record_verification(["r"], [4], [0])  # the first lookup token rejected
    assert hybrid.trust.factor("r") < 1.0
    assert hybrid.trust.adjust("r", table)[0] < table[0]


def test_a_request_whose_drafted_tokens_fail_shows_lower_survivals_and_the_same_tokens(greedy_case):  # noqa: F811
    """The drafter's own confidences are scaled by what the request earned: after its
    drafted positions are rejected round after round, the same draft carries lower
    confidences (the scheduler's survivals), while another request keeps the drafter's
    word and the drafted tokens do not change."""
    target, prompts, _ = greedy_case
    spec = SpeculativeConfig(method="dspark", model="random", num_speculative_tokens=4, lookup=True)
    engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=2, max_model_len=512))
    hybrid = engine.runner.drafter
    trust = hybrid.drafter_trust
    for _ in range(20):  # "bad": its first drafted token rejected each time; "good": all four accepted
        hybrid._last["bad"] = (LookupMatch([], 0, False), 0, [], [], [0.6, 0.6, 0.6, 0.6])
        hybrid._last["good"] = (LookupMatch([], 0, False), 0, [], [], [0.6, 0.6, 0.6, 0.6])
        hybrid.record_verification(["bad", "good"], [4, 4], [0, 4])
    assert trust.factor("bad") < 0.5 * trust.factor("good")
    # lookup tokens before the drafter's, and rounds that never reached the drafter's
    # positions, do not count for it
    before = trust.factor("bad")
    hybrid._last["bad"] = (LookupMatch([5, 6], 3, True), 2, [0.9, 0.9], [0.9, 0.9], [0.6, 0.6])
    hybrid.record_verification(["bad"], [4], [1])
    assert trust.factor("bad") == pytest.approx(before)

    class Fixed:  # a drafter output the trust rescales
        confidence = torch.tensor([[0.9, 0.6, 0.6, 0.6], [0.6, 0.6, 0.6, 0.6]])
        tokens = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])

    own = [[], []]
    out = hybrid._earned(Fixed(), ["bad", "good"], [1, 0], own)
    assert own == [[pytest.approx(0.6)] * 3, [pytest.approx(0.6)] * 4]  # the raw values, for the next record
    assert out.confidence[0, 0] == pytest.approx(0.9)  # a lookup position: the lookup trust's business
    assert (out.confidence[0, 1:] < 0.4).all() and (out.confidence[1] > 0.5).all()
    assert torch.equal(out.tokens, torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]]))


def test_trust_scaling_up_by_odds_keeps_confidences_apart_below_the_cap():
    """`odds_up`: a request on a run of hits raises its confidences' odds, so they stay
    ordered and below the cap, where linear scaling sends them all to the cap; a factor
    below 1 scales linearly either way."""
    from dspark.drafters.hybrid import RequestTrust

    linear, odds = RequestTrust(), RequestTrust()
    odds.odds_up = True
    for trust in (linear, odds):
        for _ in range(20):
            trust.observe("copy", [0.6, 0.6, 0.6], verified=3, accepted=3)
    f = odds.factor("copy")
    assert f > 1.5 and f == pytest.approx(linear.factor("copy"))
    assert linear.adjust("copy", [0.7, 0.9]) == [RequestTrust.cap, RequestTrust.cap]
    f = odds.factor("copy")
    up = odds.adjust("copy", [0.7, 0.9])
    assert up[0] < up[1] < RequestTrust.cap
    assert up[0] == pytest.approx(0.7 * f / (0.3 + 0.7 * f), rel=0.02)
    down = RequestTrust()
    down.odds_up = True
    for _ in range(20):
        down.observe("essay", [0.8], verified=1, accepted=0)
    g = down.factor("essay")
    assert g < 0.5 and down.adjust("essay", [0.8]) == [pytest.approx(0.8 * g)]
