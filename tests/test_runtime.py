"""The target runtime against Hugging Face transformers (the independent reference)."""

from __future__ import annotations

import pytest
import torch

from dspark.runtime.batch import FlatBatch
from dspark.runtime.kv_cache import ContextTooLong, KVCacheFull, KVCachePool
from dspark.runtime.loader import ModelLoadError, load_transformer

# fp32 tolerances: identical math, different kernel order.
TINY_ATOL = 1e-4
DEFAULT_ATOL = 2e-3  # logits of the real model span about +-30


def _hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def _run(model, cache, tokens, starts, slots):
    batch = FlatBatch.from_requests(tokens, starts, slots, logits="all")
    logits, _ = model(batch, cache)
    return [logits[a:b] for a, b in zip(batch.cu_seqlens, batch.cu_seqlens[1:])]


def test_tiny_models_match_transformers(tiny_hf):
    kind, path, hf = tiny_hf
    model = load_transformer(path, torch.float32)
    cache = KVCachePool(model.cfg, 2, 64, torch.float32)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 101, (20,), generator=g).tolist()
    slot = cache.allocate("a")
    ours = _run(model, cache, [ids[:13]], [0], [slot])[0]
    torch.testing.assert_close(ours, _hf_logits(hf, ids[:13]), atol=TINY_ATOL, rtol=0)
    # incremental decode over the cache: 7 more tokens in two chunks
    ours2 = _run(model, cache, [ids[13:16]], [13], [slot])[0]
    ours3 = _run(model, cache, [ids[16:]], [16], [slot])[0]
    ref = _hf_logits(hf, ids)
    torch.testing.assert_close(torch.cat([ours2, ours3]), ref[13:], atol=TINY_ATOL, rtol=0)


def test_hidden_states_match_transformers(tiny_hf):
    kind, path, hf = tiny_hf
    model = load_transformer(path, torch.float32)
    cache = KVCachePool(model.cfg, 1, 64, torch.float32)
    ids = list(range(3, 15))
    batch = FlatBatch.from_requests([ids], [0], [cache.allocate(0)], logits="none")
    _, hidden = model(batch, cache, hidden_layers=[-1, 0, 1])
    with torch.no_grad():
        ref = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states
    # HF's hidden_states[i+1] is the output of decoder layer i; [0] the embeddings.
    for j, layer in enumerate([-1, 0, 1]):
        torch.testing.assert_close(hidden[:, j], ref[layer + 1][0], atol=TINY_ATOL, rtol=0)


@pytest.mark.parametrize("num_slots", [6, 12])  # slot-major attention; gathered slots
def test_flat_batch_equals_each_request_alone(tiny_hf, num_slots):
    kind, path, _ = tiny_hf
    model = load_transformer(path, torch.float32)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 101, (n,), generator=g).tolist() for n in (5, 17, 1, 9)]
    alone = []
    for p in prompts:
        c = KVCachePool(model.cfg, 1, 64, torch.float32)
        alone.append(_run(model, c, [p], [0], [c.allocate(0)])[0])
    # Non-contiguous, shuffled slots: with 6 slots the batch holds at least half of
    # them and attention runs over every slot; with 12 the slots are gathered.
    cache = KVCachePool(model.cfg, num_slots, 64, torch.float32)
    slots = [cache.allocate(i) for i in range(num_slots)]
    use = [slots[4], slots[1], slots[5], slots[2]]
    together = _run(model, cache, prompts, [0] * 4, use)
    for a, b in zip(alone, together):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    # then a mixed step: one request decodes 1 token, another verifies 4, another 2
    steps = [[7], [8, 9, 10, 11], [12, 13]]
    which = [0, 1, 3]
    mixed = _run(model, cache, steps, [len(prompts[i]) for i in which], [use[i] for i in which])
    for k, i in enumerate(which):
        c = KVCachePool(model.cfg, 1, 64, torch.float32)
        ref = _run(model, c, [prompts[i] + steps[k]], [0], [c.allocate(0)])[0][len(prompts[i]):]
        torch.testing.assert_close(mixed[k], ref, atol=1e-5, rtol=0)


def test_rollback_then_reforward_equals_fresh(tiny_hf):
    kind, path, _ = tiny_hf
    model = load_transformer(path, torch.float32)
    cache = KVCachePool(model.cfg, 1, 64, torch.float32)
    slot = cache.allocate(0)
    ids = list(range(10, 30))
    _run(model, cache, [ids[:12]], [0], [slot])
    _run(model, cache, [[99, 98, 97, 96]], [12], [slot])  # rejected draft
    cache.truncate(slot, 12)
    assert cache.lengths[slot] == 12
    again = _run(model, cache, [ids[12:]], [12], [slot])[0]
    fresh_cache = KVCachePool(model.cfg, 1, 64, torch.float32)
    fresh = _run(model, fresh_cache, [ids], [0], [fresh_cache.allocate(0)])[0][12:]
    torch.testing.assert_close(again, fresh, atol=1e-5, rtol=0)


def test_kv_budget_and_length_errors(tiny_hf):
    kind, path, _ = tiny_hf
    model = load_transformer(path, torch.float32)
    per_token = KVCachePool.bytes_per_token(model.cfg, torch.float32)
    pool = KVCachePool(model.cfg, 2, 32, torch.float32)
    assert pool.num_slots == 2 and pool.k[0].numel() * 4 * 2 * model.cfg.num_layers == per_token * 32 * 2
    pool.allocate("a")
    pool.allocate("b")
    with pytest.raises(KVCacheFull, match="KV slots"):
        pool.allocate("c")
    pool.release("a")
    s = pool.allocate("c")
    with pytest.raises(ContextTooLong, match="maximum model length"):
        _run(model, pool, [list(range(40))], [0], [s])


def test_unreadable_model_paths(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        load_transformer(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        load_transformer(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ModelLoadError, match="unsupported model_type"):
        load_transformer(tmp_path)


@pytest.mark.slow
def test_default_model_matches_transformers(default_target_fp32):
    from transformers import AutoModelForCausalLM

    target = default_target_fp32
    hf = AutoModelForCausalLM.from_pretrained(str(target.path), dtype=torch.float32).eval()
    ids = target.tokenizer.chat_prompt("Write a haiku about the sea.")
    cache = target.new_cache(2, 256)
    slot = cache.allocate(0)
    ours = _run(target.model, cache, [ids], [0], [slot])[0]
    ref = _hf_logits(hf, ids)
    torch.testing.assert_close(ours, ref, atol=DEFAULT_ATOL, rtol=0)
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_uninitialised_cache_memory_never_leaks_into_attention(tiny_hf):
    """Masked keys past a short request's length must not contribute, even when the
    never-written cache memory holds NaN (0 * NaN = NaN in the attention matmul)."""
    kind, path, _ = tiny_hf
    model = load_transformer(path, torch.float32)
    cache = KVCachePool(model.cfg, 3, 64, torch.float32)
    for t in (*cache.k, *cache.v):
        t.fill_(float("nan"))
    prompts = [list(range(3, 8)), list(range(10, 40))]
    slots = [cache.allocate(i) for i in range(2)]
    together = _run(model, cache, prompts, [0, 0], slots)
    for p, got in zip(prompts, together):
        c = KVCachePool(model.cfg, 1, 64, torch.float32)
        torch.testing.assert_close(got, _run(model, c, [p], [0], [c.allocate(0)])[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("queries", [1, 5])
def test_grouped_attention_matches_sdpa(dtype, queries):
    """The half-precision CPU decode path against SDPA computed in fp32."""
    import torch.nn.functional as F

    from dspark.runtime.attention import attention, grouped_attention

    g = torch.Generator().manual_seed(queries)
    b, h, kvh, d, length = 3, 9, 3, 64, 40
    q = torch.randn(b, h, queries, d, generator=g)
    k = torch.randn(b, kvh, length, d, generator=g)
    v = torch.randn(b, kvh, length, d, generator=g)
    ends = torch.tensor([40, 17, 29])  # per request: how many keys the last query sees
    pos = ends.view(b, 1) - queries + torch.arange(queries).view(1, queries)
    mask = (torch.arange(length).view(1, 1, length) < (pos + 1).unsqueeze(-1)).unsqueeze(1)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    for fn in (grouped_attention, attention):
        out = fn(q.to(dtype), k.to(dtype), v.to(dtype), mask)
        assert out.dtype == dtype and out.shape == ref.shape
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    # and without a mask
    ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(grouped_attention(q.to(dtype), k.to(dtype), v.to(dtype), None).float(), ref,
                               atol=2e-2, rtol=2e-2)


def test_prefill_next_to_decodes_attends_in_groups(tiny_hf):
    """A long prompt (over the short-query limit) in the same forward as decoding and
    verifying requests: each still equals its request alone."""
    from dspark.runtime.attention import GROUPED_MAX_QUERIES

    kind, path, _ = tiny_hf
    model = load_transformer(path, torch.float32)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 101, (n,), generator=g).tolist() for n in (6, 11, 3)]
    cache = KVCachePool(model.cfg, 4, 64, torch.float32)
    slots = [cache.allocate(i) for i in range(4)]
    _run(model, cache, prompts, [0] * 3, slots[:3])
    long_prompt = torch.randint(0, 101, (GROUPED_MAX_QUERIES + 9,), generator=g).tolist()
    steps = [[7], [8, 9, 10], [12, 13], long_prompt]
    starts = [len(p) for p in prompts] + [0]
    mixed = _run(model, cache, steps, starts, slots)
    for k in range(4):
        c = KVCachePool(model.cfg, 1, 64, torch.float32)
        full = (prompts[k] if k < 3 else []) + steps[k]
        ref = _run(model, c, [full], [0], [c.allocate(0)])[0][starts[k]:]
        torch.testing.assert_close(mixed[k], ref, atol=1e-5, rtol=0)
