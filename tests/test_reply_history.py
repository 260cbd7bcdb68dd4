"""Lookup in earlier replies (`"lookup_history": true`, dspark.drafters.reply_history):
what the index proposes, that it stays bounded, that a request's own strong match
comes first, and that an engine using it decodes exactly what plain greedy decoding
does (itself pinned to transformers), with the history's proposals verified."""

from __future__ import annotations

import pytest

from dspark.drafters.lookup import LookupCalibration
from dspark.drafters.priced_lookup import LookupDrafter
from dspark.drafters.reply_history import ReplyHistory
from dspark.engine.config import SpeculativeConfig
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.errors import UserError
from dspark.sampling import SamplingParams

from test_speculative import ALL_PROMPTS, _plain_reference


def test_a_reply_continues_as_an_earlier_reply_did_and_never_past_its_end():
    h = ReplyHistory(ngram=3, min_reply=1)
    h.add([10, 11, 12, 13, 14, 15])
    h.add([20, 21, 22, 23])
    assert h.propose([5, 10, 11, 12], 3) == ([13, 14, 15], True)
    assert h.propose([10, 11, 12], 9) == ([13, 14, 15], True)  # the reply ends there
    assert h.propose([21, 22, 23], 4) == ([], True)  # a reply's end proposes nothing
    assert h.propose([12, 13], 4) == ([], True)  # shorter than the n-gram
    assert h.propose([15, 20, 21], 2) == ([], True)  # no n-gram spans two replies
    # contested: two continuations, the more frequent wins, then the latest
    h.add([11, 12, 13, 40, 41])
    h.add([11, 12, 13, 50, 51])
    assert h.propose([11, 12, 13], 2) == ([50, 51], False)
    h.add([11, 12, 13, 40, 42])
    assert h.propose([11, 12, 13], 2) == ([40, 42], False)


def test_the_history_is_bounded_and_forgets_the_oldest_replies():
    h = ReplyHistory(ngram=3, max_tokens=64, min_reply=4)
    h.add([1, 2, 3])  # too short to keep
    assert len(h) == 0 and h.replies_added == 0
    h.add([7, 8, 9, 99, 98])
    assert h.propose([7, 8, 9], 2) == ([99, 98], True)
    for i in range(40):
        h.add([100 + i, 200 + i, 300 + i, 400 + i, 500 + i])
        assert len(h) <= 64
    assert h.propose([7, 8, 9], 2) == ([], True)  # two generations later: forgotten
    assert h.propose([139, 239, 339], 1) == ([439], True)  # the newest is kept
    h.add(list(range(1000, 1200)))  # longer than a generation: its end is kept
    assert len(h) <= 64 and h.propose([1196, 1197, 1198], 1) == ([1199], True)


def test_a_reply_is_proposed_only_in_the_namespace_it_came_from():
    h = ReplyHistory(ngram=3, min_reply=1)
    h.add([10, 11, 12, 13, 14, 15], "A")
    context = [1, 2, 12, 13, 14]  # ends in a 3-gram of A's reply
    assert h.propose(context, 3, "B") == ([], True)
    assert h.propose(context, 3) == ([], True)  # nor in the shared namespace
    assert h.propose(context, 3, "A") == ([15], True)  # the paired control
    h.add([12, 13, 14, 99], "B")
    assert h.propose(context, 3, "B") == ([99], True) and h.propose(context, 3, "A") == ([15], True)
    assert h.num_namespaces == 2 and len(h) == 7 + 5


def test_the_token_budget_is_global_and_drops_the_least_recently_written_generation():
    h = ReplyHistory(ngram=3, max_tokens=64, min_reply=4)
    h.add([7, 8, 9, 99, 98], "victim")
    for i in range(5):  # the attacker's replies fill their own generations; the victim's stay meanwhile
        h.add([100 + i] * 8, "attacker")
    assert h.propose([7, 8, 9], 2, "victim") == ([99, 98], True)
    for i in range(40):
        h.add([100 + i, 200 + i, 300 + i, 400 + i, 500 + i], "attacker")
        assert len(h) <= 64
    # the victim's generation went once it was the least recently written beyond the budget
    assert h.propose([7, 8, 9], 2, "victim") == ([], True) and h.num_namespaces == 1
    assert h.propose([139, 239, 339], 1, "attacker") == ([439], True)
    assert len(h) == sum(len(g) for gens in h._spaces.values() for g in gens)


def test_lookup_draws_on_the_history_of_its_request_namespace_only():
    drafter = LookupDrafter(LookupCalibration(), max_ngram=3, min_ngram=1)
    drafter.reply_history = ReplyHistory(ngram=3, min_reply=1)
    drafter.remember_reply([60, 61, 62, 63, 64], "A")
    for rid, namespace in (("a", "A"), ("b", "B"), ("shared", None)):
        drafter.add_request(rid)
        drafter.set_namespace(rid, namespace)
    assert drafter._propose("a", 3, [1, 60, 61, 62])[0].key == "h3a"
    assert drafter._propose("b", 3, [1, 60, 61, 62])[0].key != "h3a"
    assert drafter._propose("shared", 3, [1, 60, 61, 62])[0].key != "h3a"
    for rid in ("a", "b", "shared"):
        drafter.release(rid)
    assert drafter.num_requests() == 0


def test_a_request_takes_the_history_only_where_its_own_tokens_have_no_strong_match():
    drafter = LookupDrafter(LookupCalibration(), max_ngram=3, min_ngram=1)
    drafter.reply_history = ReplyHistory(ngram=3, min_reply=1)
    drafter.remember_reply([60, 61, 62, 63, 64])
    drafter.add_request("a")
    m, conf, table_conf = drafter._propose("a", 3, [1, 60, 61, 62])
    assert m.tokens == [63, 64] and m.key == "h3a" and len(conf) == 2
    # its own 3-gram match comes first
    m, _, _ = drafter._propose("a", 3, [1, 60, 61, 62, 7, 60, 61, 62])
    assert m.tokens == [7, 60, 61] and m.key == "3a"
    drafter.release("a")
    # without a history, the same context has only its own weaker match
    plain = LookupDrafter(LookupCalibration(), max_ngram=3, min_ngram=1)
    plain.add_request("b")
    m, _, _ = plain._propose("b", 3, [1, 60, 61, 62])
    assert m.key != "h3a"


def test_lookup_history_needs_calibrated_lookup():
    assert SpeculativeConfig.from_dict({"method": "ngram", "enable_adaptive_verification": True,
                                        "lookup_history": True}).lookup_history
    with pytest.raises(UserError, match="calibrated lookup"):
        SpeculativeConfig.from_dict({"method": "dspark", "lookup_history": True})
    with pytest.raises(UserError, match="true or false"):
        SpeculativeConfig.from_dict({"method": "dspark", "lookup": True, "lookup_history": "yes"})


def test_an_engine_drafts_from_a_reply_only_for_requests_of_its_namespace(default_target_fp32):
    """A reply decoded under namespace A: the same prompt again under B gets no history
    draft (the lookup classes h3a/h3c never verified), under A it does (the paired
    control); the output is the same in every namespace."""
    from test_priced_lookup import _synthetic

    target = default_target_fp32
    prompt = target.tokenizer.chat_prompt("Write a limerick about a cat.")
    spec = SpeculativeConfig.from_dict({"method": "ngram", "enable_adaptive_verification": True,
                                        "lookup_history": True})
    engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=2, max_model_len=512), step_table=_synthetic())
    cal = engine.runner.drafter.calibration

    def history_trials() -> int:
        return sum(cal.trials.get(k, [0])[0] for k in ("h3a", "h3c"))

    def decode(namespace: str | None) -> list[int]:
        seq = engine.add_request(prompt, SamplingParams(max_tokens=24), namespace=namespace)
        while engine.has_unfinished():
            engine.step()
        return seq.output_ids

    ref = decode("A")
    assert len(ref) >= 8 and engine.runner.drafter.reply_history.num_namespaces == 1
    before = history_trials()
    assert decode("B") == ref and decode(None) == ref
    assert history_trials() == before
    assert decode("A") == ref and history_trials() > before


@pytest.mark.slow
def test_an_engine_looking_up_earlier_replies_decodes_exactly_what_plain_decoding_does(default_target_fp32):
    """Twice over the same prompts: the first pass fills the history with replies to
    other prompts (proposals that mostly fail), the second finds each reply there."""
    from test_priced_lookup import _synthetic

    target = default_target_fp32
    prompts = [target.tokenizer.chat_prompt(p) for p in ALL_PROMPTS[:8]]
    refs = _plain_reference(target, prompts, 24)
    spec = SpeculativeConfig.from_dict({"method": "ngram", "enable_adaptive_verification": True,
                                        "lookup_history": True})
    engine = LLMEngine(target, spec, EngineConfig(max_num_seqs=4, max_model_len=512), step_table=_synthetic())
    drafter = engine.runner.drafter
    for _ in range(2):
        seqs = engine.generate(prompts, SamplingParams(max_tokens=24))
        assert [s.output_ids for s in seqs] == refs
    kept = [r for r in refs if len(r) >= drafter.reply_history.min_reply]  # both passes' replies
    assert drafter.reply_history.replies_added == 2 * len(kept) >= 8
    cal = drafter.calibration
    verified = sum(cal.trials.get(k, [0])[0] for k in ("h3a", "h3c"))
    accepted = sum(cal.accepted.get(k, [0])[0] for k in ("h3a", "h3c"))
    assert verified > 0 and accepted > 0, (cal.trials.get("h3a"), cal.trials.get("h3c"))
    assert drafter.num_requests() == 0
    from dspark.serve.metrics import ServingMetrics

    metrics = ServingMetrics("m")
    metrics.on_engine(engine)
    line = next(x for x in metrics.render().splitlines() if x.startswith("dspark:spec_decode_lookup_history_tokens"))
    assert float(line.split()[-1]) == len(drafter.reply_history) == 2 * sum(len(r) + 1 for r in kept)
