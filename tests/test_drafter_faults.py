"""A faulty drafter never takes the engine down and never changes the output: draft
calls that raise, drafts with NaN/+inf logits or confidences outside [0, 1] for some
rows, and context updates that fail all end in plain decoding for the requests
concerned (greedy output still equal to plain decoding, itself pinned to
transformers), counted in `drafter_errors` and in /metrics."""

from __future__ import annotations

import pytest
import torch

from dspark.drafters.base import DraftOutput, Drafter
from dspark.drafters.ngram import NgramDrafter
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.engine.runner import SpecRunner
from dspark.generate import generate_plain
from dspark.sampling import SamplingParams
from dspark.schedule.policies import FixedLength

PROMPTS = ["Repeat after me: one two three, one two three, one two three.",
           "List the numbers 1, 2, 3, 4, 5, 1, 2, 3, 4, 5 again.",
           "Write the word cat five times.",
           "Say hello."]
MAX_TOKENS = 16


class Faulty(Drafter):
    """Prompt lookup with point-mass logits and a confidence, and injected faults."""

    method = "faulty"

    def __init__(self, vocab: int, fault: str, every: int = 3):
        super().__init__()
        self.inner = NgramDrafter(3, 1, 5)
        self.target_layer_ids = []
        self.max_draft_tokens = 5
        self.vocab, self.fault, self.every = vocab, fault, every
        self.calls = 0
        self.victim = None  # the request the context fault hits

    def add_request(self, rid):
        self.inner.add_request(rid)
        if self.victim is None:
            self.victim = rid

    def release(self, rid):
        self.inner.release(rid)

    def append_context(self, rids, tokens, starts, hidden):
        if self.fault == "context" and self.victim in rids and starts[rids.index(self.victim)] > 0:
            raise RuntimeError("injected context fault")
        self.inner.append_context(rids, tokens, starts)

    def rollback(self, rid, length):
        self.inner.rollback(rid, length)

    def context_length(self, rid):
        return self.inner.context_length(rid)

    def draft(self, requests, n):
        self.calls += 1
        if self.fault == "raise" and self.calls % self.every == 0:
            raise RuntimeError("injected draft fault")
        out = self.inner.draft(requests, n)
        toks = out.tokens.clamp_min(0)
        logits = torch.full((len(requests), n, self.vocab), float("-inf")).scatter_(-1, toks.unsqueeze(-1), 0.0)
        conf = torch.full((len(requests), n), 0.9)
        if self.calls % self.every == 0:
            if self.fault == "nan-logits":
                logits[0, 0, toks[0, 0]] = float("nan")
            elif self.fault == "inf-logits":
                logits[-1, 0, toks[-1, 0]] = float("inf")
            elif self.fault == "bad-confidence":
                conf[0, 1] = float("nan")
                conf[-1, 0] = 1.5
        return DraftOutput(out.tokens, logits, conf, out.num_valid)


@pytest.fixture(scope="module")
def case(default_target_fp32):
    target = default_target_fp32
    prompts = [target.tokenizer.chat_prompt(p) for p in PROMPTS]
    refs = [generate_plain(target, p, SamplingParams(max_tokens=MAX_TOKENS)).token_ids for p in prompts]
    return target, prompts, refs


@pytest.mark.parametrize("fault,temperature", [
    ("raise", 0.0), ("nan-logits", 0.0), ("inf-logits", 0.0), ("bad-confidence", 0.0), ("context", 0.0),
    ("raise", 0.8), ("nan-logits", 0.8)])
def test_drafter_faults_fall_back_to_plain_decoding(case, fault, temperature):
    target, prompts, refs = case
    engine = LLMEngine(target, None, EngineConfig(max_num_seqs=4, max_model_len=512))
    drafter = Faulty(target.cfg.vocab_size, fault)
    engine.runner = SpecRunner(target.model, engine.runner.cache, drafter, FixedLength(5), 5)
    params = [SamplingParams(temperature=temperature, max_tokens=MAX_TOKENS, seed=i) for i in range(len(prompts))]
    seqs = engine.generate(prompts, params)
    assert all(s.finish_reason in ("length", "stop") for s in seqs)
    assert engine.runner.drafter_errors > 0, fault
    assert engine.total_stats().rounds > 0  # speculation went on around the faults
    if temperature == 0.0:
        assert [s.output_ids for s in seqs] == refs
    if fault == "context":
        assert engine.runner.undrafted == set()  # released with the request
    assert not engine.running and engine.runner.cache.num_free == engine.runner.cache.num_slots


def test_faulty_rows_detection():
    from dspark.engine.drafts import faulty_rows as _faulty_rows

    toks = torch.tensor([[1, 2], [2, 0], [0, 1]])
    lg = torch.full((3, 2, 4), float("-inf")).scatter_(-1, toks.unsqueeze(-1), 0.0)
    ok = DraftOutput(toks, lg.clone(), torch.full((3, 2), 0.5))
    assert _faulty_rows(ok, [True, False, False]) == set()
    lg2 = lg.clone()
    lg2[1, 1, 3] = float("nan")  # off the drafted token: matters only when sampling
    assert _faulty_rows(DraftOutput(toks, lg2, None), [True, True, True]) == set()
    assert _faulty_rows(DraftOutput(toks, lg2, None), [True, False, True]) == {1}
    lg3 = lg.clone()
    lg3[2, 0, 0] = float("-inf")  # the drafted token has zero probability
    assert _faulty_rows(DraftOutput(toks, lg3, None), [True, True, True]) == {2}
    # past num_valid nothing is verified
    assert _faulty_rows(DraftOutput(toks, lg3, None, torch.tensor([2, 2, 0])), [True, True, True]) == set()
    conf = torch.tensor([[0.5, float("nan")], [0.5, 0.5], [1.2, 0.5]])
    assert _faulty_rows(DraftOutput(toks, lg, conf), [True] * 3) == {0, 2}
