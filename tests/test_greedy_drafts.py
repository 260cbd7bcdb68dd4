"""A greedy block leaves its q out where the caller says it reads tokens alone (the
engine), and keeps it for a sampled request or any other caller; the tokens and
confidences are the same either way, and the engine's greedy output stays plain
decoding's."""

from __future__ import annotations

import torch
from conftest import drafter_after_prompt

from dspark.drafters.base import DraftRequest
from dspark.drafters.factory import create_drafter
from dspark.engine.config import SpeculativeConfig
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.generate import generate_plain
from dspark.sampling import SamplingParams


def test_a_greedy_block_leaves_q_out_only_where_asked(default_target):
    tgt = default_target
    d = create_drafter("dspark", tgt)
    assert d.greedy_logits  # by default every caller gets q
    ids, anchor = drafter_after_prompt(tgt, d, "Count from one to twenty: one, two, three, four,")

    def block(params, generator=None):
        return d.draft([DraftRequest("r", anchor, len(ids), params, generator)], d.max_draft_tokens)

    full = block(SamplingParams())
    d.greedy_logits = False
    lean = block(SamplingParams())
    assert full.logits is not None and lean.logits is None
    assert torch.equal(lean.tokens, full.tokens) and torch.equal(lean.confidence, full.confidence)
    sampled = block(SamplingParams(temperature=0.7), torch.Generator().manual_seed(0))
    assert sampled.logits is not None and sampled.logits.shape == (1, d.max_draft_tokens, tgt.cfg.vocab_size)


def test_the_engine_drafts_greedy_blocks_without_q_and_stays_exact(default_target):
    tgt = default_target
    prompts = [tgt.tokenizer.chat_prompt(p) for p in ("Say one, two, three, one, two, three.", "Name a colour.")]
    engine = LLMEngine(tgt, SpeculativeConfig(method="dspark", num_speculative_tokens=3),
                       EngineConfig(max_num_seqs=2, max_model_len=512))
    drafter = engine.runner.drafter
    assert drafter.greedy_logits is False
    seen = []
    real = drafter.draft
    drafter.draft = lambda *a, **k: seen.append(real(*a, **k)) or seen[-1]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    seqs = engine.generate(prompts, params)
    assert seen and all(out.logits is None for out in seen)
    assert engine.total_stats().rounds > 0
    for seq, p in zip(seqs, prompts):
        assert seq.output_ids == generate_plain(tgt, p, params).token_ids
