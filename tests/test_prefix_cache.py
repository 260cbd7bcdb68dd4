"""Prompt prefixes computed once (dspark.engine.prefix_cache): prompts that begin like a
kept one reuse its keys and values (and the drafter's taps), and decode exactly what
they decode without the cache."""

from __future__ import annotations

import pytest
import torch

from dspark.engine.prefix_cache import PrefixCache
from dspark.runtime.config import ModelConfig
from dspark.runtime.kv_cache import KVCachePool

QUESTIONS = [
    "Explain in a few sentences why the ocean is salty.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List five tips for a good night's sleep.",
    "Explain in a few sentences why the sky is blue.",  # shares more than the template with the first
]


def _pool(layers: int = 2, slots: int = 3, max_len: int = 64) -> KVCachePool:
    cfg = ModelConfig(model_type="llama", vocab_size=32, hidden_size=8, intermediate_size=16, num_layers=layers, num_heads=2,
                      num_kv_heads=1, head_dim=4)
    return KVCachePool(cfg, slots, max_len, torch.float32)


def _fill(pool: KVCachePool, slot: int, n: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for t in (*pool.k, *pool.v):
        t[slot, :, :n] = torch.randn(t.shape[1], n, t.shape[3], generator=g)
    pool.lengths[slot] = n


def test_the_longest_shared_prefix_is_restored_up_to_the_last_prompt_token():
    pool = _pool()
    cache = PrefixCache(pool, min_tokens=4)
    a = list(range(20))
    b = list(range(10)) + [99] * 10
    _fill(pool, 0, 20, seed=1)
    cache.store(a, 0, None)
    _fill(pool, 1, 20, seed=2)
    cache.store(b, 1, None)
    assert len(cache) == 2
    entry, n = cache.match(list(range(15)) + [7, 7], need_taps=False)
    assert n == 15 and entry.tokens.tolist() == a
    entry, n = cache.match(a, need_taps=False)  # the whole prompt is kept: all but its last token
    assert n == 19
    assert cache.match([5] * 30, need_taps=False) == (None, 0)  # nothing shared
    assert cache.match(list(range(3)) + [50] * 10, need_taps=False) == (None, 0)  # below min_tokens
    assert cache.match(a, need_taps=True) == (None, 0)  # no taps kept
    taps = cache.restore(2, entry, 19)
    assert taps is None and pool.lengths[2] == 19
    for t in (*pool.k, *pool.v):
        assert torch.equal(t[2, :, :19], t[0, :, :19])
    assert cache.hits == 1 and cache.tokens_saved == 19
    with pytest.raises(ValueError, match="not empty"):
        cache.restore(2, entry, 5)


def test_entries_beyond_the_byte_budget_are_dropped_least_recently_used_first():
    pool = _pool()
    per_entry = 2 * 2 * 1 * 20 * 4 * 4  # k and v, 2 layers, 1 kv head, 20 tokens, 4 dims, fp32
    cache = PrefixCache(pool, max_bytes=2 * per_entry + 200, min_tokens=4)
    prompts = [[i] * 20 for i in range(3)]
    for i, p in enumerate(prompts[:2]):
        _fill(pool, 0, 20, seed=i)
        cache.store(p, 0, None)
        pool.lengths[0] = 0
    cache.match(prompts[0] + [1], need_taps=False)
    cache.restore(1, *cache.match(prompts[0] + [1], need_taps=False))  # the first is used again
    _fill(pool, 0, 20, seed=5)
    cache.store(prompts[2], 0, None)
    assert cache.bytes == 2 * per_entry and len(cache) == 2
    assert cache.match(prompts[1] + [1], need_taps=False) == (None, 0)  # the least recently used went
    assert cache.match(prompts[0] + [1], need_taps=False)[1] == 20
    taps = torch.randn(20, 1, 2)  # 160 bytes: the entry with taps still fits beside one other
    _fill(pool, 2, 20, seed=6)
    cache.store(prompts[0], 2, taps)  # the same prompt with taps replaces the entry without
    entry, n = cache.match(prompts[0] + [1], need_taps=True)
    assert n == 20 and torch.equal(entry.taps, taps) and len(cache) == 2


def test_a_prompt_is_matched_only_in_the_namespace_that_kept_it():
    pool = _pool()
    cache = PrefixCache(pool, min_tokens=4)
    a = list(range(20))
    _fill(pool, 0, 20, seed=1)
    cache.store(a, 0, None, namespace="A")
    query = a[:15] + [7, 7]
    assert cache.match(query, need_taps=False, namespace="B") == (None, 0)
    assert cache.match(query, need_taps=False) == (None, 0)  # nor in the shared namespace
    entry, n = cache.match(query, need_taps=False, namespace="A")  # the paired control
    assert n == 15 and entry.tokens.tolist() == a
    # the same prompt kept in two namespaces is two entries, each found only in its own
    _fill(pool, 1, 20, seed=2)
    cache.store(a, 1, None)
    assert len(cache) == 2 and cache.summary()["namespaces"] == 2
    shared, n = cache.match(query, need_taps=False)
    assert n == 15 and shared is not entry
    assert torch.equal(shared.k[0], pool.k[0][1, :, :20]) and not torch.equal(shared.k[0], entry.k[0])
    assert cache.hits == 0 and cache.lookups == 4  # matching alone restores nothing


def test_the_byte_budget_and_its_lru_order_are_global_across_namespaces():
    """One namespace filling the cache drops the least recently used entries whoever's
    they are, never more than that, and never grows it past its budget."""
    pool = _pool()
    per_entry = 2 * 2 * 1 * 20 * 4 * 4
    cache = PrefixCache(pool, max_bytes=3 * per_entry, min_tokens=4)
    _fill(pool, 0, 20, seed=0)
    victim = [1] * 20
    cache.store(victim, 0, None, namespace="victim")
    for i in range(2):  # the attacker's first two fit beside the victim's
        cache.store([50 + i] * 20, 0, None, namespace="attacker")
    assert cache.match(victim + [1], need_taps=False, namespace="victim")[1] == 20
    cache.restore(1, *cache.match(victim + [1], need_taps=False, namespace="victim"))  # used again
    cache.store([60] * 20, 0, None, namespace="attacker")  # the attacker's oldest goes, not the victim's
    assert cache.bytes == 3 * per_entry and len(cache) == 3
    assert cache.match(victim + [1], need_taps=False, namespace="victim")[1] == 20
    assert cache.match([50] * 21, need_taps=False, namespace="attacker") == (None, 0)
    for i in range(10):
        cache.store([70 + i] * 20, 0, None, namespace="attacker")
        assert cache.bytes <= 3 * per_entry
    assert cache.match(victim + [1], need_taps=False, namespace="victim") == (None, 0)  # as LRU would
    assert cache.summary()["namespaces"] == 1  # an emptied namespace leaves nothing behind


def _generate(target, spec, prompts, caching: bool, max_prefill_tokens: int = 512, **params):
    from dspark.engine.config import EngineConfig, SpeculativeConfig
    from dspark.engine.engine import LLMEngine
    from dspark.sampling import SamplingParams

    engine = LLMEngine(target, None if spec is None else SpeculativeConfig(**spec),
                       EngineConfig(max_num_seqs=2, max_model_len=512, prefix_caching=caching,
                                    max_prefill_tokens=max_prefill_tokens))
    outs = []
    for p in prompts:  # one after another: each later prompt can reuse the earlier ones
        (seq,) = engine.generate([p], SamplingParams(max_tokens=24, **params))
        outs.append((list(seq.output_ids), seq.stats.draft_tokens, seq.stats.accepted_tokens))
    return outs, engine.runner.prefix


@pytest.mark.parametrize("spec", [None, {"method": "dspark", "num_speculative_tokens": 3},
                                  {"method": "dspark", "num_speculative_tokens": 3, "lookup": True},
                                  {"method": "ngram", "num_speculative_tokens": 3}],
                         ids=["plain", "dspark", "hybrid", "lookup"])
def test_prompts_that_share_a_head_reuse_it_and_decode_exactly_as_without(default_target_bf16w, spec):
    """Greedy output equals the engine's without the cache (plain decoding, itself tested
    against transformers); with a drafter its drafts and acceptances are the same too,
    so its context built from the kept taps is the one the computed taps give. Prompt
    lookup reads no hidden states: it reuses prompts kept without taps."""
    target = default_target_bf16w
    prompts = [target.tokenizer.chat_prompt(q) for q in QUESTIONS]
    want, off = _generate(target, spec, prompts, caching=False)
    got, cache = _generate(target, spec, prompts, caching=True)
    assert off is None and cache is not None
    assert got == want
    assert cache.hits == 3  # every prompt after the first
    shared = [min(next(i for i, (x, y) in enumerate(zip(p, q)) if x != y) for q in prompts[:j])
              for j, p in enumerate(prompts) if j]
    assert cache.tokens_saved >= sum(shared) >= 3 * 20


def test_a_prompt_prefilled_in_chunks_is_reused_by_plain_requests_and_stays_exact(default_target_bf16w):
    """Prefilled in 16-token chunks, a prompt's taps are not kept whole: its keys and
    values still serve requests that do not draft, and drafting requests prefill
    themselves; both decode as without the cache."""
    target = default_target_bf16w
    prompts = [target.tokenizer.chat_prompt(q) for q in QUESTIONS]
    for spec in (None, {"method": "dspark", "num_speculative_tokens": 3}):
        want, _ = _generate(target, spec, prompts, caching=False, max_prefill_tokens=16)
        got, cache = _generate(target, spec, prompts, caching=True, max_prefill_tokens=16)
        assert got == want
        assert (cache.hits > 0) == (spec is None)


def test_sampling_with_the_cache_draws_what_it_draws_without(default_target_bf16w):
    """Seeded sampling: the same tokens with and without the cache (the reused keys and
    values are the computed ones bit for bit)."""
    target = default_target_bf16w
    prompts = [target.tokenizer.chat_prompt(q) for q in QUESTIONS[:3]]
    spec = {"method": "dspark", "num_speculative_tokens": 3, "lookup": True}
    want, _ = _generate(target, spec, prompts, caching=False, temperature=0.8, seed=11)
    got, cache = _generate(target, spec, prompts, caching=True, temperature=0.8, seed=11)
    assert got == want and cache.hits == 2


@pytest.mark.slow
def test_reuse_stays_exact_while_the_governor_switches_modes(greedy_case):  # noqa: F811
    """The default configuration with its fallback switching every few steps: prompts
    kept in a plain-mode step have no taps (the step tapped nothing), those kept while
    speculating do; requests admitted in either mode reuse what they may and decode
    exactly the plain greedy references (decoded without any engine)."""
    from dspark.engine.load_governor import OFF, ON, LoadGovernor
    from dspark.sampling import SamplingParams
    from test_live_step_time import adaptive_hybrid_engine

    target, prompts, refs = greedy_case
    engine, _ = adaptive_hybrid_engine(target)
    engine.speculate_or_plain = LoadGovernor(trial=2, min_gap=2, max_gap=4, warmup=1)
    outs = []
    for i in range(0, 8, 2):  # two at a time: the later pairs reuse the earlier prompts
        outs += engine.generate(prompts[i: i + 2], SamplingParams(max_tokens=24))
    for seq, ref in zip(outs, refs[:8]):
        assert seq.output_ids == ref
    gov, cache = engine.speculate_or_plain, engine.runner.prefix
    assert gov.steps(ON) > 0 and gov.steps(OFF) > 0
    assert cache is not None and cache.hits >= 6


from test_speculative import greedy_case, tiny_target  # noqa: E402,F401  (fixtures)
