"""Drafters: inference contract (shapes, determinism, batching, rollback), the DSpark
heads, checkpoints (round trip, mismatches, the public release's layout) and n-gram
lookup. Tiny random targets built from the runtime's `Transformer`."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import drafter_after_prompt
from safetensors.torch import load_file, save_file

from dspark.drafters import (
    DraftRequest,
    DrafterCheckpointError,
    DrafterConfigError,
    create_drafter,
    load_drafter,
    save_drafter,
)
from dspark.drafters.config import spread_layer_ids
from dspark.drafters.ngram import propose_continuation
from dspark.runtime.batch import FlatBatch
from dspark.runtime.config import ModelConfig
from dspark.runtime.kv_cache import KVCachePool
from dspark.runtime.model import Transformer
from dspark.sampling import SamplingParams

VOCAB = 96
WEIGHTED = ["dspark", "dflash", "eagle3", "mtp"]
ATOL = 1e-5  # fp32, same math in a different batch layout


def tiny_target(kind: str = "llama", seed: int = 0, **overrides) -> Transformer:
    fields = dict(model_type=kind, vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=4,
                  num_heads=4, num_kv_heads=2, max_position_embeddings=512, rope_theta=10000.0,
                  qk_norm=kind == "qwen3", head_dim=16 if kind == "qwen3" else 0)
    fields.update(overrides)
    torch.manual_seed(seed)
    return Transformer(ModelConfig(**fields), max_len=512).eval()


def scramble(drafter, seed: int = 1) -> None:
    """Weights large enough that drafts depend visibly on context and tokens."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * noise)
            elif "markov" in name:
                p.copy_(0.5 * noise)
            else:
                p.copy_((0.3 if p.dim() == 1 else 1.0 / math.sqrt(p.shape[-1])) * noise)


def make(method: str, target: Transformer, seed: int = 1, **sizes):
    if method == "dspark":
        sizes.setdefault("markov_rank", 8)
    d = create_drafter(method, target, **sizes)
    scramble(d, seed)
    return d


@torch.inference_mode()
def target_hidden(target: Transformer, ids: list[int], layers: list[int]) -> torch.Tensor:
    """[len(ids), len(layers), hidden] tapped hidden states of a causal prefill."""
    if not layers:
        return torch.zeros(len(ids), 0, target.cfg.hidden_size)
    cache = KVCachePool(target.cfg, 1, len(ids) + 1, torch.float32)
    batch = FlatBatch.from_requests([ids], [0], [cache.allocate(0)], logits="none")
    return target(batch, cache, hidden_layers=layers)[1]


def sequence(seed: int, n: int = 40) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def request(rid, seq: list[int], p: int, params: SamplingParams | None = None, seed: int | None = None) -> DraftRequest:
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    return DraftRequest(rid, seq[p], p, params or SamplingParams(), gen)


def feed(drafter, target, rid, seq: list[int], start: int, end: int) -> None:
    hid = target_hidden(target, seq[:end], drafter.target_layer_ids)[start:end]
    drafter.append_context([rid], [seq[start:end]], [start], hid)


def fresh(method, target, seq, p, rid="r", **sizes):
    d = make(method, target, **sizes)
    d.add_request(rid)
    feed(d, target, rid, seq, 0, p)
    return d


def num_draft(drafter) -> int:
    return min(drafter.max_draft_tokens, 5)


@pytest.fixture(scope="module")
def target() -> Transformer:
    return tiny_target()


# --- contract: shapes, determinism, sampling ------------------------------------------


@pytest.mark.parametrize("method", WEIGHTED)
def test_draft_shapes_and_greedy_determinism(method, target):
    seq = sequence(0)
    d = fresh(method, target, seq, 15)
    n = num_draft(d)
    out = d.draft([request("r", seq, 15)], n)
    assert out.tokens.shape == (1, n) and out.tokens.dtype == torch.long
    assert out.logits.shape == (1, n, VOCAB) and out.logits.dtype == torch.float32
    assert torch.equal(out.tokens, out.logits.argmax(-1))  # greedy = argmax of the returned logits
    if method == "dspark":
        assert out.confidence.shape == (1, n) and ((out.confidence > 0) & (out.confidence < 1)).all()
    else:
        assert out.confidence is None
    again = d.draft([request("r", seq, 15)], n)  # drafting leaves the context untouched
    assert torch.equal(again.tokens, out.tokens) and torch.equal(again.logits, out.logits)
    assert d.context_length("r") == 15


@pytest.mark.parametrize("method", WEIGHTED)
def test_sampling_reproducible_with_seeded_generator(method, target):
    seq = sequence(1)
    d = fresh(method, target, seq, 12)
    n = num_draft(d)
    params = SamplingParams(temperature=1.5, top_k=50, top_p=0.95)
    a = d.draft([request("r", seq, 12, params, seed=7)], n)
    b = d.draft([request("r", seq, 12, params, seed=7)], n)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logits, b.logits)
    draws = {tuple(d.draft([request("r", seq, 12, params, seed=s)], n).tokens[0].tolist()) for s in range(8)}
    assert len(draws) > 1


def test_draft_checks_its_inputs(target):
    seq = sequence(2)
    d = fresh("dspark", target, seq, 10)
    with pytest.raises(ValueError, match="anchor at position"):
        d.draft([request("r", seq, 9)], 3)
    with pytest.raises(ValueError, match="1..7 tokens"):
        d.draft([request("r", seq, 10)], 8)
    with pytest.raises(ValueError, match="no gaps"):
        d.append_context(["r"], [seq[12:14]], [12], target_hidden(target, seq[:14], d.target_layer_ids)[12:14])
    with pytest.raises(ValueError, match="not registered"):
        d.draft([request("x", seq, 10)], 3)
    m = fresh("mtp", target, seq, 10)
    assert m.max_draft_tokens == 1
    with pytest.raises(ValueError, match="1..1 tokens"):
        m.draft([request("r", seq, 10)], 2)


# --- batching and rollback ---------------------------------------------------------------


@pytest.mark.parametrize("method", WEIGHTED)
def test_batch_matches_each_request_alone(method, target):
    seqs = [sequence(10 + i) for i in range(3)]
    lens = [5, 17, 11]
    params = [SamplingParams(), SamplingParams(temperature=1.0), SamplingParams(top_k=5, temperature=0.7)]
    d = make(method, target)
    hidden = [target_hidden(target, s[:p], d.target_layer_ids) for s, p in zip(seqs, lens)]
    for i in range(3):
        d.add_request(i)
    d.append_context([0, 1, 2], [s[:p] for s, p in zip(seqs, lens)], [0, 0, 0], torch.cat(hidden))
    n = num_draft(d)
    batch = d.draft([request(i, s, p, params[i], seed=i) for i, (s, p) in enumerate(zip(seqs, lens))], n)
    for i, (s, p) in enumerate(zip(seqs, lens)):
        alone = fresh(method, target, s, p, rid="solo").draft([request("solo", s, p, params[i], seed=i)], n)
        assert torch.equal(batch.tokens[i], alone.tokens[0])
        torch.testing.assert_close(batch.logits[i], alone.logits[0], atol=ATOL, rtol=0)
        if method == "dspark":
            torch.testing.assert_close(batch.confidence[i], alone.confidence[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("method", WEIGHTED + ["ngram"])
def test_rollback_and_reappend_equals_fresh_request(method, target):
    seq = sequence(20) + sequence(20)[:8]  # a repeat so n-gram has something to find
    d = make(method, target)
    d.add_request("r")
    feed(d, target, "r", seq, 0, 12)
    wrong = [(t + 1) % VOCAB for t in seq[12:20]]  # append a wrong continuation, then take it back
    hid = target_hidden(target, seq[:12] + wrong, d.target_layer_ids)[12:20]
    d.append_context(["r"], [wrong], [12], hid)
    assert d.context_length("r") == 20
    d.rollback("r", 9)
    assert d.context_length("r") == 9
    feed(d, target, "r", seq, 9, 30)
    d.append_context(["r"], [seq[27:40]], [27], target_hidden(target, seq[:40], d.target_layer_ids)[27:40])
    n = num_draft(d)
    got = d.draft([request("r", seq, 40)], n)
    want = fresh(method, target, seq, 40).draft([request("r", seq, 40)], n)
    assert torch.equal(got.tokens, want.tokens)
    if got.logits is not None:
        torch.testing.assert_close(got.logits, want.logits, atol=ATOL, rtol=0)


def test_release_frees_the_slot_for_reuse(target):
    seq = sequence(3)
    d = make("eagle3", target)
    d.reserve(num_slots=1, max_len=64)
    d.add_request("a")
    feed(d, target, "a", seq, 0, 20)
    d.release("a")
    d.add_request("b")
    assert d.context_length("b") == 0
    feed(d, target, "b", seq, 0, 7)
    want = fresh("eagle3", target, seq, 7).draft([request("r", seq, 7)], 4)
    assert torch.equal(d.draft([request("b", seq, 7)], 4).tokens, want.tokens)


# --- DSpark heads --------------------------------------------------------------------------


def test_backbone_runs_once_per_draft(target):
    seq = sequence(4)
    d = fresh("dspark", target, seq, 14)
    calls = [0] * len(d.layers)
    for i, layer in enumerate(d.layers):
        layer.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    d.draft([request("r", seq, 14)], d.max_draft_tokens)
    assert calls == [1] * len(d.layers)
    e = fresh("eagle3", target, seq, 14)  # autoregressive: one forward per drafted token
    counter = []
    e.layers[0].register_forward_hook(lambda *_: counter.append(1))
    e.draft([request("r", seq, 14)], 4)
    assert len(counter) == 4


def test_markov_bias_is_added_exactly(target):
    seq = sequence(5)
    d = fresh("dspark", target, seq, 14)
    d.markov_candidates = 0  # the full-vocabulary head, as in training
    params = SamplingParams(temperature=1.0)
    n = d.max_draft_tokens
    out = d.draft([request("r", seq, 14, params, seed=3)], n)
    w2 = d.markov_head.markov_w2.weight.detach().clone()
    with torch.no_grad():
        d.markov_head.markov_w2.weight.zero_()
    base = d.draft([request("r", seq, 14, params, seed=3)], n).logits  # backbone logits alone
    with torch.no_grad():
        d.markov_head.markov_w2.weight.copy_(w2)
    prev = torch.cat([torch.tensor([seq[14]]), out.tokens[0, :-1]])  # token_{k-1}, anchor first
    bias = d.markov_head.markov_w1.weight[prev] @ w2.T  # [n, vocab]
    torch.testing.assert_close(out.logits[0] - base[0], bias, atol=1e-5, rtol=0)
    # another previous token changes position k's logits by exactly the bias difference
    other = (prev + 1) % VOCAB
    bias_other = d.markov_head.markov_w1.weight[other] @ w2.T
    torch.testing.assert_close(base[0] + bias_other - out.logits[0], bias_other - bias, atol=1e-5, rtol=0)


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
def test_candidate_restricted_markov_head(target, head):
    """Drafting with the Markov bias on the backbone's top-C tokens only: the returned
    logits are the full head's logits on exactly those tokens and -inf elsewhere,
    greedy tokens are their argmax, and C = vocabulary is the full head."""
    seq = sequence(7)
    d = fresh("dspark", target, seq, 14, markov_head_type=head)
    n = d.max_draft_tokens
    greedy = SamplingParams(temperature=0.0)
    d.markov_candidates = 0
    full = d.draft([request("r", seq, 14, greedy)], n)
    d.markov_candidates = VOCAB
    assert torch.equal(d.draft([request("r", seq, 14, greedy)], n).tokens, full.tokens)
    d.markov_candidates = 10
    for params in (greedy, SamplingParams(temperature=1.0, top_k=5)):
        out = d.draft([request("r", seq, 14, params, seed=4)], n)
        finite = torch.isfinite(out.logits[0])  # [n, vocab]
        assert (finite.sum(-1) == 10).all()
        # the full head's logits, teacher-forced on the tokens this draft chose
        d.markov_candidates = 0
        with torch.no_grad():
            h = d.norm(d.run_backbone(
                d.target.embed(d.block_token_ids(torch.tensor([seq[14]])), d.dtype),
                14 + torch.arange(d.config.block_size)[None],
                [(d.pool.k[i][:1, :, :14], d.pool.v[i][:1, :, :14]) for i in range(len(d.layers))], None,
            )[:, 1 : 1 + n])
            base = d.target.logits(h)[0]  # [n, vocab] backbone logits alone
            prev = torch.cat([torch.tensor([seq[14]]), out.tokens[0, :-1]])
            want, _ = d.head_outputs(h, prev[None])
        d.markov_candidates = 10
        assert torch.equal(finite, torch.zeros_like(finite).scatter_(1, base.topk(10, -1).indices, True))
        torch.testing.assert_close(out.logits[0][finite], want[0][finite], atol=1e-4, rtol=0)
        assert finite.gather(1, out.tokens[0][:, None]).all()  # every token is a candidate
        if params.greedy:
            assert torch.equal(out.tokens[0], out.logits[0].argmax(-1))


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
@pytest.mark.parametrize("with_markov", [True, False])
def test_training_pieces_reproduce_the_draft(target, head, with_markov):
    """Teacher forcing with the drafted tokens through the training API gives the
    draft's logits and confidences: one model, two entry points."""
    seq = sequence(6)
    p = 13
    d = fresh("dspark", target, seq, p, markov_head_type=head, confidence_head_with_markov=with_markov)
    d.markov_candidates = 0  # the full-vocabulary head, as in training
    d.confidence_head.set_temperatures([0.5 + 0.25 * k for k in range(d.max_draft_tokens)])
    out = d.draft([request("r", seq, p, SamplingParams(temperature=1.0), seed=1)], d.max_draft_tokens)
    with torch.no_grad():
        feats = d.context_features(target_hidden(target, seq[:p], d.target_layer_ids))[None]  # [1, P, H]
        kv = d.context_kv(feats, torch.arange(p)[None])
        ids = d.block_token_ids(torch.tensor([seq[p]]))  # [1, Q]
        x = target.embed_tokens(ids)
        h = d.norm(d.run_backbone(x, p + torch.arange(ids.shape[1])[None], kv, None))[:, 1:]
        prev = torch.cat([torch.tensor([[seq[p]]]), out.tokens[:, :-1]], dim=1)
        logits, conf_logit = d.head_outputs(h, prev)
    torch.testing.assert_close(logits, out.logits, atol=1e-4, rtol=0)
    temps = torch.tensor(d.confidence_head.temperatures)
    torch.testing.assert_close(torch.sigmoid(conf_logit / temps), out.confidence, atol=1e-5, rtol=0)


def test_dflash_is_dspark_without_heads(target):
    d = make("dflash", target)
    assert d.markov_head is None and d.confidence_head is None
    assert not any(k.startswith(("markov_head", "confidence_head")) for k in d.state_dict())
    with pytest.raises(DrafterConfigError, match="no Markov or confidence head"):
        create_drafter("dflash", target, markov_rank=8)
    with pytest.raises(DrafterConfigError, match="markov_head_type"):
        create_drafter("dspark", target, markov_head_type="lstm")


# --- checkpoints -----------------------------------------------------------------------------


@pytest.mark.parametrize("method", WEIGHTED)
def test_checkpoint_round_trip(method, target, tmp_path):
    seq = sequence(7)
    d = fresh(method, target, seq, 16)
    if method == "dspark":
        d.confidence_head.set_temperatures([1.5] * d.max_draft_tokens)
    save_drafter(d, tmp_path / "ckpt")
    names = set(load_file(str(tmp_path / "ckpt" / "model.safetensors")))
    assert names == set(d.state_dict()) and not names & {"embed_tokens.weight", "lm_head.weight"}
    cfg = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert cfg["target_layer_ids"] == d.target_layer_ids and cfg["num_target_layers"] == 4
    assert cfg["block_size"] == d.max_draft_tokens + 1
    assert (tmp_path / "ckpt" / "calibration.json").exists() == (method == "dspark")
    loaded = load_drafter(tmp_path / "ckpt", target)
    assert type(loaded) is type(d) and loaded.method == method
    loaded.add_request("r")
    feed(loaded, target, "r", seq, 0, 16)
    n = num_draft(d)
    a = d.draft([request("r", seq, 16, SamplingParams(temperature=0.8), seed=2)], n)
    b = loaded.draft([request("r", seq, 16, SamplingParams(temperature=0.8), seed=2)], n)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logits, b.logits)
    if method == "dspark":
        assert loaded.confidence_head.temperatures == [1.5] * d.max_draft_tokens
        assert torch.equal(a.confidence, b.confidence)


def test_checkpoint_mismatches_are_clear(target, tmp_path):
    d = make("dspark", target)
    path = save_drafter(d, tmp_path / "ckpt")
    with pytest.raises(DrafterCheckpointError, match="vocab_size 96 != the target's 100"):
        load_drafter(path, tiny_target(vocab_size=100))
    with pytest.raises(DrafterCheckpointError, match="hidden_size 32 != the target's 48"):
        load_drafter(path, tiny_target(hidden_size=48))
    with pytest.raises(DrafterCheckpointError, match="num_target_layers 4 != the target's 2"):
        load_drafter(path, tiny_target(num_layers=2))

    def edit(**fields):
        cfg = json.loads((path / "config.json").read_text())
        cfg.update(fields)
        out = tmp_path / f"edit{len(list(tmp_path.iterdir()))}"
        out.mkdir()
        (out / "config.json").write_text(json.dumps(cfg))
        (out / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())
        return out

    with pytest.raises(DrafterCheckpointError, match=r"target_layer_ids \[4, 7\] are out of range"):
        load_drafter(edit(target_layer_ids=[0, 4, 7, 1, 2]), target)
    with pytest.raises(DrafterCheckpointError, match="unknown drafter architecture 'GPT2DSparkModel'"):
        load_drafter(edit(architectures=["GPT2DSparkModel"]), target)
    with pytest.raises(DrafterCheckpointError, match=r"missing weights \['layers.2."):
        load_drafter(edit(num_hidden_layers=3), target)
    with pytest.raises(DrafterCheckpointError, match="unexpected weights"):
        load_drafter(edit(enable_confidence_head=False, confidence_head_with_markov=False), target)
    with pytest.raises(DrafterCheckpointError, match="config.json not found"):
        load_drafter(tmp_path, target)
    weights = load_file(str(path / "model.safetensors"))
    weights["embed_tokens.weight"] = torch.zeros(VOCAB + 1, 32)
    save_file(weights, str(path / "model.safetensors"))
    with pytest.raises(DrafterCheckpointError, match=r"embed_tokens.weight has shape \[97, 32\]"):
        load_drafter(path, target)


def test_public_release_layout_for_a_qwen3_target(tmp_path):
    """A DSpark checkpoint written as the public release lays it out (config field
    names, rope_parameters, shared embedding and LM head inside, the block convention
    stated: see test_interop for a checkpoint without it) loads and drafts."""
    target = tiny_target("qwen3")
    h, hd, heads, kv, inter, r, gamma = 32, 16, 4, 2, 48, 8, 3
    cfg = {
        "architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "attention_bias": False,
        "attention_dropout": 0.0, "hidden_act": "silu", "hidden_size": h, "intermediate_size": inter,
        "num_hidden_layers": 2, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 512, "vocab_size": VOCAB,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "tie_word_embeddings": False,
        "dtype": "bfloat16", "use_cache": True, "layer_types": ["full_attention"] * 2,
        "block_size": gamma + 1, "mask_token_id": VOCAB - 2, "target_layer_ids": [0, 2, 3],
        "num_target_layers": 4, "num_anchors": 512, "markov_rank": r, "markov_head_type": "vanilla",
        "enable_confidence_head": True, "confidence_head_with_markov": True, "sample_from_anchor": False,
    }
    g = torch.Generator().manual_seed(0)

    def w(*shape):
        return (torch.randn(shape, generator=g) / math.sqrt(shape[-1])).to(torch.bfloat16)

    weights = {"fc.weight": w(h, 3 * h), "hidden_norm.weight": w(h) + 1, "norm.weight": w(h) + 1,
               "embed_tokens.weight": w(VOCAB, h), "lm_head.weight": w(VOCAB, h),
               "markov_head.markov_w1.weight": w(VOCAB, r), "markov_head.markov_w2.weight": w(VOCAB, r),
               "confidence_head.proj.weight": w(1, h + r), "confidence_head.proj.bias": w(1)}
    for i in range(2):
        p = f"layers.{i}."
        weights.update({
            p + "self_attn.q_proj.weight": w(heads * hd, h), p + "self_attn.k_proj.weight": w(kv * hd, h),
            p + "self_attn.v_proj.weight": w(kv * hd, h), p + "self_attn.o_proj.weight": w(h, heads * hd),
            p + "self_attn.q_norm.weight": w(hd) + 1, p + "self_attn.k_norm.weight": w(hd) + 1,
            p + "mlp.gate_proj.weight": w(inter, h), p + "mlp.up_proj.weight": w(inter, h),
            p + "mlp.down_proj.weight": w(h, inter),
            p + "input_layernorm.weight": w(h) + 1, p + "post_attention_layernorm.weight": w(h) + 1,
        })
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file(weights, str(tmp_path / "model.safetensors"))
    (tmp_path / "calibration.json").write_text(json.dumps({"temperatures": [1.0, 1.2, 1.4]}))
    d = load_drafter(tmp_path, target)
    assert d.method == "dspark" and d.max_draft_tokens == gamma and d.target_layer_ids == [0, 2, 3]
    assert d.layers[0].self_attn.q_norm is not None and d.dtype == torch.float32
    assert d.confidence_head.temperatures == [1.0, 1.2, 1.4]
    seq = sequence(8)
    d.add_request("r")
    feed(d, target, "r", seq, 0, 9)
    out = d.draft([request("r", seq, 9)], gamma)
    assert out.tokens.shape == (1, gamma) and (torch.isfinite(out.logits).sum(-1) == min(64, out.logits.shape[-1])).all()
    assert ((out.confidence > 0) & (out.confidence < 1)).all()


# --- n-gram ------------------------------------------------------------------------------------


def test_ngram_proposes_the_latest_longest_match():
    d = create_drafter("ngram", None, max_ngram=3)
    d.add_request("a")
    ctx = [10, 11, 12, 13, 14, 20, 21, 30, 11, 12, 40, 10, 11]
    d.append_context(["a"], [ctx], [0], None)
    out = d.draft([DraftRequest("a", 12, len(ctx), SamplingParams(), None)], 4)
    # suffix "10 11 12" occurs at 0 (the 2-gram "11 12" also at 8, but longer n wins)
    assert out.tokens.tolist() == [[13, 14, 20, 21]] and out.num_valid.tolist() == [4]
    assert out.logits is None and out.confidence is None

    d.add_request("b")
    d.append_context(["b"], [[5, 1, 7, 5, 2, 8]], [0], None)
    out = d.draft([DraftRequest("b", 5, 6, SamplingParams(), None)], 5)
    # only the 1-gram "5" matches; its latest earlier occurrence (index 3) is followed by
    # 2, 8, 5 and then the sequence ends: 3 valid tokens, the rest padded with -1
    assert out.tokens.tolist() == [[2, 8, 5, -1, -1]] and out.num_valid.tolist() == [3]

    out = d.draft([DraftRequest("b", 99, 6, SamplingParams(), None)], 3)
    assert out.num_valid.tolist() == [0] and out.tokens.tolist() == [[-1, -1, -1]]
    d.rollback("b", 2)
    assert d.context_length("b") == 2
    assert propose_continuation(torch.tensor([1, 2, 3, 1, 2, 3, 1, 2]), 4, 3, 1) == [3, 1, 2]


def test_spread_layer_ids():
    assert spread_layer_ids(30, 3) == [1, 14, 27]
    assert spread_layer_ids(4, 3) == [0, 2, 3]
    assert spread_layer_ids(30, 1) == [27]


# --- the real default model ------------------------------------------------------------------


@pytest.mark.slow
def test_default_model_drafters(default_target):
    tgt = default_target
    d = create_drafter("dspark", tgt)
    assert d.config.mask_token_id == 16  # <empty_output>, never produced in chat
    assert create_drafter("eagle3", tgt).target_layer_ids == [1, 14, 27]
    assert create_drafter("mtp", tgt).target_layer_ids == [29]
    ids, anchor = drafter_after_prompt(tgt, d, "Count from one to twenty: one, two, three, four,")
    out = d.draft([DraftRequest("r", anchor, len(ids), SamplingParams(), None)], d.max_draft_tokens)
    assert out.tokens.shape == (1, 7) and out.logits.shape == (1, 7, tgt.cfg.vocab_size)
    assert (torch.isfinite(out.logits).sum(-1) == d.markov_candidates).all()  # the candidates
    assert ((out.confidence > 0) & (out.confidence < 1)).all()
