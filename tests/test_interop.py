"""Other projects' checkpoint layouts (dspark.drafters.interop): export -> load drafts
exactly what the original drafter drafts; synthetic checkpoints written from each
layout's documented key set load; the block convention is never guessed; and, when the
llama.cpp source is present, its converter turns an exported DSpark drafter into a GGUF."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dspark.drafters import DraftRequest, DrafterCheckpointError, create_drafter, load_drafter, save_drafter
from dspark.drafters.export import export_caveats, export_drafter
from dspark.drafters.interop import detect_layout
from dspark.sampling import SamplingParams
from test_drafters import scramble, target_hidden
from test_train import TINY_VOCAB, tiny_dir, tiny_target  # noqa: F401  (shared fixtures)

H, LAYERS = 64, 4  # the tiny target's hidden size and depth
REPO = Path(__file__).resolve().parents[1]


def make(method: str, target, **sizes):
    if method == "dspark":
        sizes.setdefault("markov_rank", 8)
    if sizes.get("draft_vocab_size"):
        g = torch.Generator().manual_seed(3)
        sizes["draft_token_ids"] = torch.randperm(TINY_VOCAB, generator=g)[: sizes["draft_vocab_size"]].tolist()
    d = create_drafter(method, target, **sizes)
    scramble(d, seed=2)
    return d


def drafts(drafter, target, n: int | None = None):
    """Greedy and seeded-sampled drafts of two requests of different context lengths."""
    seqs = [torch.randint(0, TINY_VOCAB, (30,), generator=torch.Generator().manual_seed(s)).tolist() for s in (0, 1)]
    lens = [17, 23]
    n = n or drafter.max_draft_tokens
    outs = []
    for params, seed in ((SamplingParams(), None), (SamplingParams(temperature=0.8, top_k=20), 7)):
        reqs = []
        for i, (seq, p) in enumerate(zip(seqs, lens)):
            drafter.add_request(i)
            hid = target_hidden(target.model, seq[:p], drafter.target_layer_ids)
            drafter.append_context([i], [seq[:p]], [0], hid)
            gen = torch.Generator().manual_seed(seed + i) if seed is not None else None
            reqs.append(DraftRequest(i, seq[p], p, params, gen))
        outs.append(drafter.draft(reqs, n))
        for i in range(len(seqs)):
            drafter.release(i)
    return outs


def assert_same_drafts(a, b, target):
    for x, y in zip(drafts(a, target), drafts(b, target)):
        assert torch.equal(x.tokens, y.tokens)
        assert torch.equal(x.logits, y.logits)
        assert (x.confidence is None) == (y.confidence is None)
        if x.confidence is not None:
            assert torch.equal(x.confidence, y.confidence)


ROUND_TRIPS = [
    ("dspark", "deepspec", {}),
    ("dspark", "deepspec", {"sample_from_anchor": True}),
    ("dspark", "deepspec", {"draft_vocab_size": 40}),
    ("dspark", "deepspec", {"draft_vocab_size": 40, "sample_from_anchor": True, "markov_head_type": "gated"}),
    ("dspark", "speculators", {}),
    ("dspark", "speculators", {"draft_vocab_size": 40, "sample_from_anchor": True}),
    ("dflash", "deepspec", {}),
    ("dflash", "speculators", {"sample_from_anchor": True}),
    ("eagle3", "eagle3", {}),
    ("eagle3", "eagle3", {"draft_vocab_size": 40}),
    ("eagle3", "speculators", {}),
    ("eagle3", "speculators", {"draft_vocab_size": 40}),
    ("dspark", "llama.cpp", {"draft_vocab_size": 40}),
    ("dflash", "llama.cpp", {}),
    ("dflash", "llama.cpp", {"draft_vocab_size": 40, "sample_from_anchor": True}),
    ("eagle3", "llama.cpp", {}),
]
# the layout each method's llama.cpp export is written in
LLAMA_CPP_LAYOUT = {"dspark": "deepspec", "dflash": "deepspec", "eagle3": "eagle3"}


@pytest.mark.parametrize("method,fmt,sizes", ROUND_TRIPS,
                         ids=[f"{m}-{f}-" + ("-".join(f"{k}={v}" for k, v in s.items()) or "default")
                              for m, f, s in ROUND_TRIPS])
def test_export_then_load_drafts_identically(method, fmt, sizes, tiny_target, tmp_path):
    original = make(method, tiny_target, **sizes)
    if method == "dspark":
        original.confidence_head.set_temperatures([1.0 + 0.1 * k for k in range(original.max_draft_tokens)])
    src = save_drafter(original, tmp_path / "ours")
    out = export_drafter(src, fmt, tmp_path / fmt, target=tiny_target)
    raw = json.loads((out / "config.json").read_text())
    assert detect_layout(raw) == (LLAMA_CPP_LAYOUT[method] if fmt == "llama.cpp" else fmt)
    back = load_drafter(out, tiny_target.model)
    assert back.method == method
    assert back.config.sample_from_anchor == original.config.sample_from_anchor
    assert back.target_layer_ids == original.target_layer_ids and back.max_draft_tokens == original.max_draft_tokens
    if method == "dspark":
        assert back.confidence_head.temperatures == original.confidence_head.temperatures
    assert_same_drafts(original, back, tiny_target)


def test_an_external_checkpoint_exports_to_another_layout(tiny_target, tmp_path):
    original = make("dspark", tiny_target, draft_vocab_size=40)
    spec = export_drafter(save_drafter(original, tmp_path / "d"), "speculators", tmp_path / "sp", target=tiny_target)
    deepspec = export_drafter(spec, "deepspec", tmp_path / "ds", target=tiny_target)
    assert_same_drafts(original, load_drafter(deepspec, tiny_target.model), tiny_target)


def test_exported_key_sets(tiny_target, tmp_path):
    """The names the readers look for (llama.cpp's converter, vLLM, speculators)."""
    src = save_drafter(make("dspark", tiny_target, sample_from_anchor=True), tmp_path / "d")
    cfg = json.loads((export_drafter(src, "deepspec", tmp_path / "ds") / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["model_type"] == "qwen3"
    assert cfg["sample_from_anchor"] is True and cfg["dspark_bonus_anchor"] is False
    assert cfg["enable_confidence_head"] is True and cfg["draft_vocab_size"] == TINY_VOCAB
    assert cfg["dflash_config"]["target_layer_ids"] == cfg["target_layer_ids"]

    spec = export_drafter(src, "speculators", tmp_path / "sp", target=tiny_target)
    cfg = json.loads((spec / "config.json").read_text())
    assert cfg["architectures"] == ["DSparkSpeculator"] and cfg["speculators_model_type"] == "dspark"
    taps = json.loads((src / "config.json").read_text())["target_layer_ids"]
    assert cfg["aux_hidden_state_layer_ids"] == [i + 1 for i in taps]
    assert cfg["transformer_layer_config"]["model_type"] == "qwen3"
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 8

    e = make("eagle3", tiny_target)
    out = export_drafter(save_drafter(e, tmp_path / "e"), "eagle3", tmp_path / "e3", target=tiny_target)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == TINY_VOCAB and cfg["norm_before_residual"] is False
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in e.target_layer_ids]
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert torch.equal(f.get_tensor("d2t"), torch.zeros(TINY_VOCAB, dtype=torch.long))
        assert torch.equal(f.get_tensor("lm_head.weight"), tiny_target.model.lm_head.weight)
    assert {"midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight", "midlayer.self_attn.q_proj.weight",
            "fc.weight", "norm.weight", "lm_head.weight", "d2t"} <= names
    assert not any(n.startswith("layers.") or n == "hidden_norm.weight" for n in names)


def test_exports_that_have_no_reader_are_refused(tiny_target, tmp_path):
    llama_style = save_drafter(make("dspark", tiny_target, model_type="llama"), tmp_path / "llama")
    with pytest.raises(DrafterCheckpointError, match="Qwen3-style layers"):
        export_drafter(llama_style, "deepspec", tmp_path / "x")
    mtp = save_drafter(make("mtp", tiny_target), tmp_path / "mtp")
    with pytest.raises(DrafterCheckpointError, match="block drafters"):
        export_drafter(mtp, "speculators", tmp_path / "x", target=tiny_target)
    two_taps = save_drafter(make("eagle3", tiny_target, target_layer_ids=[1, 3]), tmp_path / "e")
    with pytest.raises(DrafterCheckpointError, match="exactly 3 target layers"):
        export_drafter(two_taps, "eagle3", tmp_path / "x", target=tiny_target)
    flash = save_drafter(make("dflash", tiny_target, sample_from_anchor=True), tmp_path / "f")
    with pytest.raises(DrafterCheckpointError, match="sample_from_anchor"):
        export_drafter(flash, "deepspec", tmp_path / "x")


def test_export_cli(tiny_dir, tiny_target, tmp_path, capsys):
    from dspark.cli.main import main

    src = save_drafter(make("dspark", tiny_target), tmp_path / "d")
    assert main(["export", str(src), "--to", "deepspec", str(tmp_path / "out"), "--model", str(tiny_dir)]) == 0
    assert "wrote deepspec drafter" in capsys.readouterr().out
    assert main(["export", str(src), "--to", "eagle3", str(tmp_path / "x"), "--model", str(tiny_dir)]) == 2
    assert "holds Eagle3 drafters, not dspark" in capsys.readouterr().err


def test_a_llama_cpp_export_that_taps_the_last_layer_warns(tiny_dir, tiny_target, tmp_path, capsys):
    """llama-server reads tap i as the input of layer i + 1, which its llama/qwen graphs
    do not keep past the last layer: exporting a block drafter that taps the last layer
    to llama.cpp says so (the export itself succeeds); one that taps below it is quiet."""
    from dspark.cli.main import main

    last = tiny_target.cfg.num_layers - 1
    tapping = save_drafter(make("dspark", tiny_target, target_layer_ids=[0, last]), tmp_path / "last")
    below = save_drafter(make("dspark", tiny_target, target_layer_ids=[0, last - 1]), tmp_path / "below")
    assert main(["export", str(tapping), "--to", "llama.cpp", str(tmp_path / "o1"), "--model", str(tiny_dir)]) == 0
    err = capsys.readouterr().err
    assert f"taps the target's last layer ({last})" in err and "draft-dspark" in err
    assert main(["export", str(below), "--to", "llama.cpp", str(tmp_path / "o2"), "--model", str(tiny_dir)]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["export", str(tapping), "--to", "speculators", str(tmp_path / "o3"), "--model", str(tiny_dir)]) == 0
    assert "warning" not in capsys.readouterr().err  # only llama.cpp's reader is known not to serve it
    # an external checkpoint that does not say how many layers its target has: the
    # target's count decides, not its highest tap
    ext = export_drafter(below, "deepspec", tmp_path / "ext")
    raw = json.loads((ext / "config.json").read_text())
    del raw["num_target_layers"]
    (ext / "config.json").write_text(json.dumps(raw))
    assert export_caveats(ext, "llama.cpp", target=tiny_target) == []


# --- synthetic checkpoints in each layout's documented names ---------------------------------


def _weights(spec: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in spec.items():
        w = torch.randn(shape, generator=g) / math.sqrt(shape[-1])
        out[name] = w + 1 if name.endswith("norm.weight") else w
    return out


def _layer(prefix: str, qwen3: bool, attn_in: int = H) -> dict[str, tuple[int, ...]]:
    heads, kv, hd, inter = 4, 2, 16, 128
    spec = {
        prefix + "self_attn.q_proj.weight": (heads * hd, attn_in),
        prefix + "self_attn.k_proj.weight": (kv * hd, attn_in),
        prefix + "self_attn.v_proj.weight": (kv * hd, attn_in), prefix + "self_attn.o_proj.weight": (H, heads * hd),
        prefix + "mlp.gate_proj.weight": (inter, H), prefix + "mlp.up_proj.weight": (inter, H),
        prefix + "mlp.down_proj.weight": (H, inter),
        prefix + "input_layernorm.weight": (H,), prefix + "post_attention_layernorm.weight": (H,),
    }
    if qwen3:
        spec.update({prefix + "self_attn.q_norm.weight": (hd,), prefix + "self_attn.k_norm.weight": (hd,)})
    return spec


QWEN3_LAYER = {"hidden_size": H, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 16, "max_position_embeddings": 512, "vocab_size": TINY_VOCAB, "rope_theta": 10000.0}


def _write(path: Path, config: dict, weights: dict[str, torch.Tensor]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(weights, str(path / "model.safetensors"))
    return path


def _vocab_map(draft_vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.arange(5, 5 + draft_vocab)
    t2d = torch.zeros(TINY_VOCAB, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(draft_vocab), t2d


def _can_draft(d, tiny_target):
    out = drafts(d, tiny_target)[0]
    assert out.tokens.shape == (2, d.max_draft_tokens) and torch.isfinite(out.logits).any(-1).all()


def test_zlab_dflash_layout_loads(tiny_target, tmp_path):
    """DFlashDraftModel as z-lab ships it: dflash_config nesting, transformers' own keys,
    no embedding or LM head; with the block convention stated."""
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", **QWEN3_LAYER, "num_hidden_layers": 2,
           "block_size": 6, "num_target_layers": LAYERS, "transformers_version": "4.57.0", "use_cache": True,
           "dflash_config": {"mask_token_id": 2, "target_layer_ids": [0, 2, 3]}, "sample_from_anchor": False}
    spec = {"fc.weight": (H, 3 * H), "hidden_norm.weight": (H,), "norm.weight": (H,),
            **_layer("layers.0.", True), **_layer("layers.1.", True)}
    d = load_drafter(_write(tmp_path / "z", cfg, _weights(spec)), tiny_target.model)
    assert d.method == "dflash" and d.target_layer_ids == [0, 2, 3] and d.max_draft_tokens == 5
    _can_draft(d, tiny_target)


def test_speculators_dspark_layout_loads(tiny_target, tmp_path):
    """DSparkSpeculator: layer fields as a diff under transformer_layer_config (the
    Qwen3Config defaults rms_norm_eps, attention_bias, rope left out), taps numbered one
    higher, reduced vocabulary with d2t/t2d, embed_tokens + lm_head inside; written
    before sample_from_anchor existed, so the bonus-anchor convention."""
    vd, r = 40, 8
    d2t, t2d = _vocab_map(vd)
    cfg = {"architectures": ["DSparkSpeculator"], "speculators_model_type": "dspark",
           "transformer_layer_config": {"model_type": "qwen3", "num_hidden_layers": 1, **QWEN3_LAYER},
           "draft_vocab_size": vd, "block_size": 5, "aux_hidden_state_layer_ids": [1, 3, 4], "mask_token_id": 2,
           "markov_rank": r, "markov_head_type": "vanilla", "enable_confidence_head": True,
           "confidence_head_with_markov": True, "speculators_config": {"algorithm": "dspark"}}
    spec = {"fc.weight": (H, 3 * H), "hidden_norm.weight": (H,), "norm.weight": (H,), **_layer("layers.0.", True),
            "embed_tokens.weight": (TINY_VOCAB, H), "lm_head.weight": (vd, H),
            "markov_head.markov_w1.weight": (TINY_VOCAB, r), "markov_head.markov_w2.weight": (vd, r),
            "confidence_head.proj.weight": (1, H + r), "confidence_head.proj.bias": (1,)}
    d = load_drafter(_write(tmp_path / "s", cfg, {**_weights(spec), "d2t": d2t, "t2d": t2d}), tiny_target.model)
    assert d.method == "dspark" and d.target_layer_ids == [0, 2, 3] and d.max_draft_tokens == 4
    assert d.config.draft_vocab_size == vd and torch.equal(d.draft_token_ids(), torch.arange(5, 5 + vd))
    assert d.config.rms_norm_eps == 1e-6 and d.config.num_target_layers == LAYERS
    _can_draft(d, tiny_target)
    out = drafts(d, tiny_target)[0]
    assert ((out.tokens >= 5) & (out.tokens < 5 + vd)).all()


def test_specforge_eagle3_layout_loads(tiny_target, tmp_path):
    """LlamaForCausalLMEagle3 as SpecForge saves it: midlayer.* (with hidden_norm), fc,
    norm, lm_head over the draft vocabulary, d2t and t2d."""
    vd = 48
    d2t, t2d = _vocab_map(vd)
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
           "hidden_size": H, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
           "num_key_value_heads": 2, "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "vocab_size": TINY_VOCAB, "draft_vocab_size": vd, "tie_word_embeddings": False, "torch_dtype": "float32",
           "eagle_aux_hidden_state_layer_ids": [1, 2, 4], "transformers_version": "4.53.0"}
    spec = {"fc.weight": (H, 3 * H), "norm.weight": (H,), "lm_head.weight": (vd, H),
            "midlayer.hidden_norm.weight": (H,), **_layer("midlayer.", False, attn_in=2 * H)}
    d = load_drafter(_write(tmp_path / "e", cfg, {**_weights(spec), "d2t": d2t, "t2d": t2d}), tiny_target.model)
    assert d.method == "eagle3" and d.target_layer_ids == [0, 1, 3] and d.config.draft_vocab_size == vd
    _can_draft(d, tiny_target)


def test_block_convention_is_never_guessed(tiny_target, tmp_path):
    ours = save_drafter(make("dspark", tiny_target), tmp_path / "ours")
    cfg = json.loads((ours / "config.json").read_text())
    # our older checkpoints (no sample_from_anchor, nothing but our own keys) keep loading
    del cfg["sample_from_anchor"]
    (ours / "config.json").write_text(json.dumps(cfg))
    assert load_drafter(ours, tiny_target.model).config.sample_from_anchor is False
    # the same fields plus one transformers writes: a DeepSpec checkpoint, refused
    (ours / "config.json").write_text(json.dumps({**cfg, "transformers_version": "4.57.0"}))
    with pytest.raises(DrafterCheckpointError, match="lacks the field 'sample_from_anchor'") as e:
        load_drafter(ours, tiny_target.model)
    assert "true = the DeepSpec convention" in str(e.value) and "false = the DFlash/EAGLE convention" in str(e.value)
    # vLLM's negated spelling decides it too
    negated = {**cfg, "transformers_version": "4.57.0", "dspark_bonus_anchor": False}
    (ours / "config.json").write_text(json.dumps(negated))
    assert load_drafter(ours, tiny_target.model).config.sample_from_anchor is True


# --- llama.cpp's converter -------------------------------------------------------------------


def _llama_cpp_dir() -> Path | None:
    d = Path(os.environ.get("DSPARK_LLAMA_CPP_DIR") or REPO / ".llama.cpp")
    return d if (d / "convert_hf_to_gguf.py").is_file() else None


def _bpe_target_dir(tiny_dir: Path, path: Path) -> Path:
    """The tiny target with a byte-fallback BPE tokenizer: llama.cpp's converter takes the
    draft's vocabulary from the target and reads a Llama target's tokenizer that way."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    for f in ("config.json", "model.safetensors"):
        shutil.copyfile(tiny_dir / f, path / f)
    pieces = ["<unk>", "<s>", "</s>", "<mask>"] + [chr(c) for c in range(ord("a"), ord("a") + TINY_VOCAB - 4)]
    tok = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=[], unk_token="<unk>",
                               byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(str(path))
    return path


def test_llama_cpp_converter_reads_an_exported_dspark_drafter(tiny_dir, tiny_target, tmp_path):
    llcpp = _llama_cpp_dir()
    if llcpp is None:
        pytest.skip("llama.cpp source not found: set DSPARK_LLAMA_CPP_DIR or run scripts/install_llama_cpp.sh")
    pytest.importorskip("sentencepiece", reason="llama.cpp's converter imports sentencepiece "
                                                "(scripts/install_llama_cpp.sh installs it)")
    from gguf import GGUFReader

    vd = 40
    d = make("dspark", tiny_target, sample_from_anchor=True, draft_vocab_size=vd)
    out = export_drafter(save_drafter(d, tmp_path / "d"), "deepspec", tmp_path / "deepspec")
    gguf_path = tmp_path / "draft.gguf"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(llcpp / "convert_hf_to_gguf.py"), str(out), "--target-model-dir",
                          str(_bpe_target_dir(tiny_dir, tmp_path / "target")), "--outtype", "bf16",
                          "--outfile", str(gguf_path)], capture_output=True, text=True, env=env, timeout=600)
    print(run.stderr[-2500:])
    assert run.returncode == 0, run.stderr[-4000:]
    reader = GGUFReader(str(gguf_path))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.token")}
    assert fields["general.architecture"] == "dflash"
    assert fields["dflash.block_size"] == 8 and fields["dflash.sample_from_anchor"] is True
    assert fields["dflash.has_confidence_head"] is True
    assert fields["dflash.target_layers"] == [i + 1 for i in d.target_layer_ids]
    assert fields["tokenizer.ggml.mask_token_id"] == d.config.mask_token_id
    tensors = {t.name: t for t in reader.tensors}
    assert {"fc.weight", "enc.output_norm.weight", "output_norm.weight", "output.weight", "markov_w1.weight",
            "markov_w2.weight", "conf_proj.weight", "conf_proj.bias", "d2t",
            "blk.0.attn_q_norm.weight", "blk.1.attn_k_norm.weight", "blk.1.ffn_down.weight"} <= set(tensors)
    assert "t2d" not in tensors
    assert tensors["d2t"].data.tolist() == d.draft_token_ids().tolist()  # absolute target ids
    assert list(tensors["output.weight"].shape) == [H, vd]


def test_llama_cpp_converter_reads_an_exported_dflash_drafter(tiny_dir, tiny_target, tmp_path):
    """DFlash goes through llama.cpp's DSpark reader: the GGUF records the block
    convention (its DFlash reader would leave llama-server to assume sample_from_anchor)
    and the reduced vocabulary's d2t, and holds no Markov or confidence head."""
    llcpp = _llama_cpp_dir()
    if llcpp is None:
        pytest.skip("llama.cpp source not found: set DSPARK_LLAMA_CPP_DIR or run scripts/install_llama_cpp.sh")
    pytest.importorskip("sentencepiece", reason="llama.cpp's converter imports sentencepiece")
    from gguf import GGUFReader

    d = make("dflash", tiny_target, draft_vocab_size=40)
    assert d.config.sample_from_anchor is False
    out = export_drafter(save_drafter(d, tmp_path / "d"), "llama.cpp", tmp_path / "lc")
    gguf_path = tmp_path / "draft.gguf"
    run = subprocess.run([sys.executable, str(llcpp / "convert_hf_to_gguf.py"), str(out), "--target-model-dir",
                          str(_bpe_target_dir(tiny_dir, tmp_path / "target")), "--outtype", "bf16",
                          "--outfile", str(gguf_path)], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    reader = GGUFReader(str(gguf_path))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.token")}
    assert fields["general.architecture"] == "dflash"
    assert fields["dflash.sample_from_anchor"] is False and fields["dflash.has_confidence_head"] is False
    tensors = {t.name for t in reader.tensors}
    assert "d2t" in tensors and not {"markov_w1.weight", "markov_w2.weight", "conf_proj.weight"} & tensors
