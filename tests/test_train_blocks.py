"""The block drafters' start and training attention: `--init target` against
transformers, `--init DIR` (continuing from a trained drafter), and the two attention
paths of the teacher-forced backbone."""

from __future__ import annotations

import pytest
import torch

from test_train import (TINY_VOCAB, _log, tiny_data, tiny_dir, tiny_target, train_config,  # noqa: F401  (shared fixtures)
                        trained)


def test_init_from_target_copies_the_last_layers(tiny_dir, tiny_target):
    """`--init target`: drafter layer j computes what target layer L-N+j computes, and the
    injected values of drafter layer 0 are the values target layer L-N computes from its
    input, the tapped output of layer L-N-1 (checked against transformers)."""
    from transformers import LlamaForCausalLM

    from dspark.drafters import create_drafter
    from dspark.errors import UserError
    from dspark.train.init import init_from_target

    hf = LlamaForCausalLM.from_pretrained(str(tiny_dir), torch_dtype=torch.float32).eval()
    d = create_drafter("dspark", tiny_target, seed=1, dtype=torch.float32, markov_rank=8, block_size=5,
                       num_hidden_layers=2, target_layer_ids=[0, 1, 3])
    lines = init_from_target(d, tiny_target.model)
    assert any("layer 0 <- target layer 2" in x for x in lines)
    ids = torch.randint(3, TINY_VOCAB, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        states = hf(ids, output_hidden_states=True).hidden_states  # [0] = embeddings, [l + 1] = layer l
        taps = torch.stack([states[t + 1] for t in d.target_layer_ids], dim=-2)  # [1, 9, taps, H]
        feats = d.context_features(taps)
        ref_layer = hf.model.layers[2]
        torch.testing.assert_close(d.layers[0].self_attn.v_proj(feats),
                                   ref_layer.self_attn.v_proj(ref_layer.input_layernorm(states[2])))
        x = torch.randn(5, 64)
        torch.testing.assert_close(d.layers[1].mlp(x), hf.model.layers[3].mlp(x))
        torch.testing.assert_close(d.layers[1].self_attn.q_proj(x), hf.model.layers[3].self_attn.q_proj(x))
    wrong_taps = create_drafter("dspark", tiny_target, seed=1, dtype=torch.float32, markov_rank=8,
                                block_size=5, num_hidden_layers=2, target_layer_ids=[0, 3])
    with pytest.raises(UserError, match="needs target layer 1"):
        init_from_target(wrong_taps, tiny_target.model)


def test_per_block_attention_equals_the_block_diagonal_mask(tiny_target):
    """The two training paths of the block drafters' backbone (per-block scores, one
    masked attention over all blocks) give the same outputs and gradients."""
    from dspark.drafters import create_drafter
    from dspark.train.objectives import block_diagonal_mask

    d = create_drafter("dspark", tiny_target, seed=1, dtype=torch.float32, markov_rank=8, block_size=5)
    g = torch.Generator().manual_seed(2)
    b, s, a, q = 2, 12, 3, 5
    hidden = torch.randn(b, s, len(d.target_layer_ids), 64, generator=g)
    anchors = torch.tensor([[1, 4, 9], [0, 6, 11]])
    see = torch.arange(s).view(1, 1, s) < anchors.view(b, a, 1)
    x = torch.randn(b, a * q, 64, generator=g)
    pos = (anchors.unsqueeze(-1) + torch.arange(q)).flatten(1)
    outs, grads = [], []
    for per_block in (True, False):
        d.zero_grad(set_to_none=True)
        ctx = d.context_kv(d.context_features(hidden), torch.arange(s).expand(b, s))
        h = d.run_backbone_blocks(x, pos, ctx, see) if per_block else \
            d.run_backbone(x, pos, ctx, block_diagonal_mask(see, q))
        h.pow(2).sum().backward()
        outs.append(h.detach())
        grads.append(d.layers[0].self_attn.q_proj.weight.grad.clone())
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-4, rtol=1e-4)


def test_init_from_a_trained_drafter_continues_it(trained, tiny_target, tiny_data, tmp_path):
    from safetensors.torch import load_file

    from dspark.errors import UserError
    from dspark.train import Trainer

    before = load_file(str(trained["dspark"] / "model.safetensors"))
    go_on = Trainer(train_config("dspark", tiny_data, tmp_path / "on", max_steps=4, init=str(trained["dspark"])),
                    tiny_target)
    state = go_on.drafter.state_dict()
    for name, w in before.items():  # it starts as the trained drafter, vocabulary included
        torch.testing.assert_close(state[name].float(), w.float(), atol=0, rtol=0)
    assert all(p.requires_grad for p in go_on.drafter.parameters())
    go_on.run()
    fresh = Trainer(train_config("dspark", tiny_data, tmp_path / "fresh", max_steps=4), tiny_target)
    fresh.run()
    # 16 steps ahead at its start: a far lower loss than a random start's
    assert _log(tmp_path / "on")[0]["loss"] < 0.9 * _log(tmp_path / "fresh")[0]["loss"]
    after = load_file(str(tmp_path / "on" / "model.safetensors"))
    assert any(not torch.equal(after[k], before[k]) for k in before)  # and it trained
    for kw, message in (({"markov_rank": 16}, "markov_rank 16 (the drafter has 8)"),
                        ({"method": "dflash"}, "is a dspark drafter, not dflash")):
        with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
            Trainer(train_config(kw.pop("method", "dspark"), tiny_data, tmp_path / "bad",
                                 init=str(trained["dspark"]), **kw), tiny_target)
    with pytest.raises(UserError, match="--init must be random, target or a trained drafter"):
        train_config("dspark", tiny_data, tmp_path / "bad", init=str(tmp_path / "nowhere"))


def test_a_trained_drafter_grows_layers_and_drafts_the_same_until_trained(trained, tiny_target, tiny_data, tmp_path):
    """`--init DIR --num-layers N` (N above the drafter's): the new layers are copies of
    its last with zero output projections, so the grown drafter computes exactly what
    the trained one did; it trains, saves N layers, loads and resumes as such."""
    from dspark.drafters import load_drafter
    from dspark.errors import UserError
    from dspark.train import Trainer

    old = load_drafter(trained["dspark"], tiny_target, dtype=torch.float32)
    n = len(old.layers)
    cfg = train_config("dspark", tiny_data, tmp_path / "grown", max_steps=4, save_every=2, init=str(trained["dspark"]),
                       num_layers=n + 1)
    grown = Trainer(cfg, tiny_target)
    d = grown.drafter
    assert len(d.layers) == n + 1 and d.config.num_hidden_layers == n + 1
    g = torch.Generator().manual_seed(5)
    b, s, a, q = 2, 10, 2, 5
    hidden = torch.randn(b, s, len(d.target_layer_ids), 64, generator=g)
    see = torch.arange(s).view(1, 1, s) < torch.tensor([[3, 8], [2, 6]]).view(b, a, 1)
    x = torch.randn(b, a * q, 64, generator=g)
    pos = (torch.tensor([[3, 8], [2, 6]]).unsqueeze(-1) + torch.arange(q)).flatten(1)
    with torch.no_grad():
        outs = [m.run_backbone_blocks(x, pos, m.context_kv(m.context_features(hidden), torch.arange(s).expand(b, s)), see)
                for m in (old, d)]
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(d.layers[n].self_attn.q_proj.weight, torch.zeros_like(d.layers[n].self_attn.q_proj.weight))
    grown.run()
    after = load_drafter(tmp_path / "grown", tiny_target, dtype=torch.float32)
    assert len(after.layers) == n + 1
    assert float(after.layers[n].mlp.down_proj.weight.detach().abs().sum()) > 0  # the new layer trained
    resumed = Trainer(train_config("dspark", tiny_data, tmp_path / "grown", max_steps=6, save_every=2,
                                   init=str(trained["dspark"]), num_layers=n + 1, resume=True), tiny_target)
    assert resumed.step == 4 and len(resumed.drafter.layers) == n + 1
    with pytest.raises(UserError, match="can grow, not shrink"):
        Trainer(train_config("dspark", tiny_data, tmp_path / "bad", init=str(tmp_path / "grown"), num_layers=n),
                tiny_target)


def test_retap_moves_a_drafters_taps_keeping_what_it_computes_where_the_layers_agree(tiny_target):
    """`retap`: each new tap's block of fc columns is the nearest old tap's (a tie to the
    deeper), divided among the new taps sharing it; so where a new tap's features equal
    the old tap's, the context features are the trained drafter's own."""
    from dspark.drafters import create_drafter
    from dspark.errors import UserError
    from dspark.train.init import retap

    d = create_drafter("dspark", tiny_target, seed=1, dtype=torch.float32, markov_rank=8, block_size=5,
                       target_layer_ids=[0, 1, 3])
    g = torch.Generator().manual_seed(2)
    h0, h1, h3 = (torch.randn(2, 7, 64, generator=g) for _ in range(3))
    old = d.context_features(torch.stack([h0, h1, h3], dim=-2))
    moved, lines = retap(d, tiny_target.model, [0, 1, 2])  # 2 is as near 1 as 3: the deeper (3) gives its columns
    assert moved.target_layer_ids == [0, 1, 2] and moved.config.target_layer_ids == [0, 1, 2]
    assert lines[2] == "tap 2: target layer 2 <- the columns of layer 3"
    with torch.no_grad():
        torch.testing.assert_close(moved.context_features(torch.stack([h0, h1, h3], dim=-2)), old)
    shared, lines = retap(d, tiny_target.model, [0, 2, 3])  # 2 and 3 share layer 3's columns; layer 1's go
    assert lines[1].endswith("(shared by 2)")
    without_1 = d.context_features(torch.stack([h0, torch.zeros_like(h1), h3], dim=-2))
    with torch.no_grad():
        torch.testing.assert_close(shared.context_features(torch.stack([h0, h3, h3], dim=-2)), without_1)
        assert not torch.allclose(shared.context_features(torch.stack([h0, h1, h3], dim=-2)), without_1)
    with pytest.raises(UserError, match="out of range"):
        retap(d, tiny_target.model, [0, 1, 4])


def test_a_trained_drafter_continues_on_other_taps(trained, tiny_target, tiny_data, tmp_path):
    """`--init DIR --target-layer-ids ...`: the drafter trains on the new taps (its
    teacher taps them), saves them and loads with them."""
    from dspark.drafters import load_drafter
    from dspark.train import Trainer

    old = load_drafter(trained["dspark"], tiny_target, dtype=torch.float32).target_layer_ids
    taps = [t for t in old[:-1]] + [next(t for t in (3, 2, 1, 0, -1) if t not in old)]
    t = Trainer(train_config("dspark", tiny_data, tmp_path / "moved", max_steps=2, save_every=2,
                             init=str(trained["dspark"]), target_layer_ids=taps), tiny_target)
    assert t.drafter.target_layer_ids == taps
    t.run()
    assert load_drafter(tmp_path / "moved", tiny_target, dtype=torch.float32).target_layer_ids == taps


def test_renewal_tau_over_greedy_output_is_the_engines_tau(trained, tiny_target, tmp_path):
    """Teacher-forced matches walked as decoding meets them (dspark/train/heldout.py)
    predict greedy decoding's τ at a fixed block, round for round, checked against
    the engine run on the same prompts; the per-anchor mean weights positions
    differently and is not asked to agree."""
    import json

    from dspark.engine.config import EngineConfig, SpeculativeConfig
    from dspark.engine.engine import LLMEngine
    from dspark.sampling import SamplingParams
    from dspark.train import Trainer
    from dspark.train.heldout import renewal_tau

    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, TINY_VOCAB, (int(n),), generator=g).tolist()
               for n in torch.randint(4, 12, (6,), generator=g)]
    params = [SamplingParams(temperature=0.0, max_tokens=40) for _ in prompts]
    plain = LLMEngine(tiny_target, None, EngineConfig(max_num_seqs=6, max_model_len=256)).generate(prompts, params)
    records = tmp_path / "greedy.jsonl"
    records.write_text("".join(json.dumps({"id": str(i), "domain": "chat", "prompt_token_ids": p,
                                           "response_token_ids": list(s.output_ids), "finish_reason": "length"}) + "\n"
                               for i, (p, s) in enumerate(zip(prompts, plain))))
    trainer = Trainer(train_config("dspark", records, tmp_path / "unused", init=str(trained["dspark"]),
                                   blocks_per_seq=64, eval_data=[str(records)]), tiny_target)
    got = renewal_tau(trainer, trainer.teacher, trainer.seqs)["all"]
    spec = SpeculativeConfig(method="dspark", model=str(trained["dspark"]), num_speculative_tokens=trainer.gamma,
                             verification_policy="fixed")
    engine = LLMEngine(tiny_target, spec, EngineConfig(max_num_seqs=6, max_model_len=256))
    spec_out = engine.generate(prompts, params)
    assert [s.output_ids for s in spec_out] == [s.output_ids for s in plain]
    stats = engine.total_stats()
    assert got["tokens"] == stats.rounds + stats.accepted_tokens
    assert got["rounds"] == stats.rounds
    assert 1.0 < got["renewal_tau"] < got["anchor_tau"]  # the drafter accepts something; decoding lingers where it fails
    logged = trainer.evaluate()  # the same records as held-out data: what training logs
    assert logged["heldout_renewal_tau"] == round(got["renewal_tau"], 4)
    assert logged["heldout_tau"] == round(got["anchor_tau"], 4)


def test_round_start_weights_walk_the_rounds_of_decoding(trained, tiny_target, tiny_data, tmp_path):
    """An anchor weighs 1 + W where greedy decoding with these matches would start a
    round: at the first anchor, then one past each round's accepted prefix; a start
    that was not sampled resumes at the next sampled anchor. Training with it runs."""
    from dspark.train import Trainer
    from dspark.train.heldout import round_start_weights
    from dspark.train.objectives import AnchorBatch

    batch = AnchorBatch.build([list(range(40)), list(range(40))], [[5, 6, 7, 8, 9, 10, 11, 12], [3, 4, 9, 20]],
                              3, "cpu")
    m = torch.zeros(batch.valid.shape, dtype=torch.bool)
    m[0, 0, :2] = True  # anchor 5 accepts 2: the next round starts at 8
    m[0, 4, :] = True  # anchor 9 accepts 3: the next round would start at 13, past the visit
    m[1, 0, 0] = True  # anchor 3 accepts 1: the start at 5 was not sampled, resume at 9
    w = torch.zeros(batch.valid.shape)
    w[batch.valid] = round_start_weights(batch, m[batch.valid], 2.0)
    assert w[0, :, 0].tolist() == [3, 1, 1, 3, 3, 1, 1, 1]  # starts 5, 8, 9
    assert w[1, :4, 0].tolist() == [3, 1, 3, 3]  # starts 3, 9, 20
    assert (w[batch.valid] == w[..., :1].expand_as(w)[batch.valid]).all()  # a block's positions weigh as its anchor
    result = Trainer(train_config("dspark", tiny_data, tmp_path / "rs", init=str(trained["dspark"]), max_steps=3,
                                  blocks_per_seq=64, round_start_weight=2.0), tiny_target).run()
    assert result.steps == 3 and torch.isfinite(torch.tensor(result.last_log["loss"]))


def test_a_trained_drafter_grows_its_draft_vocabulary(tiny_target, tiny_data, tmp_path):
    """`--init DIR --draft-vocab-size N` (N above the drafter's): its own tokens keep
    their LM-head and Markov rows, so it scores them as before; the added tokens are the
    next most frequent response tokens, their head rows the target's LM-head rows and
    their Markov rows zero. It trains, saves N tokens and loads as such; a smaller N is
    refused."""
    from dspark.drafters import load_drafter
    from dspark.errors import UserError
    from dspark.train import Trainer
    from dspark.train.vocab import response_token_counts

    small = Trainer(train_config("dspark", tiny_data, tmp_path / "small", max_steps=2, draft_vocab_size=20),
                    tiny_target)
    small.run()
    old = load_drafter(tmp_path / "small", tiny_target, dtype=torch.float32)
    t = Trainer(train_config("dspark", tiny_data, tmp_path / "big", max_steps=2, draft_vocab_size=32,
                             init=str(tmp_path / "small")), tiny_target)
    d = t.drafter
    assert d.config.draft_vocab_size == 32
    old_ids, ids = old.draft_token_ids(), d.draft_token_ids()
    assert set(old_ids.tolist()) < set(ids.tolist()) and torch.equal(ids, ids.sort().values)
    counts = response_token_counts(t.seqs, tiny_target.model.cfg.vocab_size)
    added = sorted(set(ids.tolist()) - set(old_ids.tolist()))
    left = [i for i in range(TINY_VOCAB) if i not in set(ids.tolist())]
    assert not left or min(counts[added]) >= max(counts[left])  # the most frequent of the rest
    h = torch.randn(3, 64, generator=torch.Generator().manual_seed(4))
    z = torch.randn(3, 8, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        before = old.to_target_logits(old.head_logits(h) + old.markov_head.bias(z))
        after = d.to_target_logits(d.head_logits(h) + d.markov_head.bias(z))
        torch.testing.assert_close(after[:, old_ids], before[:, old_ids], atol=1e-6, rtol=1e-6)
        new = d.to_draft_ids(torch.tensor(added))
        torch.testing.assert_close(d.lm_head.weight[new], tiny_target.model.lm_head.weight[added].float())
        assert torch.equal(d.markov_head.markov_w2.weight[new], torch.zeros(len(added), 8))
    t.run()
    assert load_drafter(tmp_path / "big", tiny_target, dtype=torch.float32).config.draft_vocab_size == 32
    with pytest.raises(UserError, match="draft_vocab_size 16"):
        Trainer(train_config("dspark", tiny_data, tmp_path / "bad", draft_vocab_size=16,
                             init=str(tmp_path / "small")), tiny_target)



def test_a_trained_drafter_grows_its_vocabulary_and_moves_its_taps_in_one_run(tiny_target, tiny_data, tmp_path,
                                                                            capsys):
    """`--init DIR --draft-vocab-size N --target-layer-ids ...` at once: both are applied
    and both are reported in the training log (each change one line)."""
    from dspark.drafters import load_drafter
    from dspark.train import Trainer

    Trainer(train_config("dspark", tiny_data, tmp_path / "small", max_steps=2, draft_vocab_size=20),
            tiny_target).run()
    old = load_drafter(tmp_path / "small", tiny_target, dtype=torch.float32).target_layer_ids
    taps = [t for t in old[:-1]] + [next(t for t in (3, 2, 1, 0, -1) if t not in old)]
    capsys.readouterr()
    t = Trainer(train_config("dspark", tiny_data, tmp_path / "both", max_steps=2, draft_vocab_size=32,
                             init=str(tmp_path / "small"), target_layer_ids=taps), tiny_target)
    log = capsys.readouterr().err
    assert t.drafter.config.draft_vocab_size == 32 and t.drafter.target_layer_ids == taps
    assert "[train] init: draft vocabulary" in log and "[train] init: tap " in log


def test_lookup_miss_weight_reweighs_the_loss(trained, tiny_target, tiny_data, tmp_path):
    """`--lookup-miss-weight W`: the same batches, a different weighted loss (the lookup
    misses weigh 1 + W); W = 0 is the plain objective."""
    from dspark.train import Trainer

    logs = {}
    for w in (0.0, 3.0):
        t = Trainer(train_config("dspark", tiny_data, tmp_path / f"w{w}", max_steps=1,
                                 init=str(trained["dspark"]), lookup_miss_weight=w), tiny_target)
        assert (t.lookup_misses is None) == (w == 0)
        t.run()
        logs[w] = _log(tmp_path / f"w{w}")[0]
    assert logs[0.0]["loss"] != logs[3.0]["loss"]
