"""Quantized GGUF files served as stored: a tiny file of each architecture whose linears
mix every type the kernel reads loads with `--dtype auto` as stored (gguf, or q8x where
it measures faster), and in `gguf` computes what transformers computes in fp32 on the
same file, decodes the same greedy tokens, and gives a row the same bits whatever
shares its step. A type the kernel cannot read gets a message naming the tensor;
`--dtype fp32` still serves it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import make_tiny_hf_model
from dspark.runtime import cpu_kernels
from dspark.runtime.loader import load_transformer
from dspark.runtime.quantized import TYPES, QuantError
from test_gguf import _llama_permute, write_header
from test_loading import _logits
from test_quant_kernels import random_blocks

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="native kernels unavailable")

#: per GGUF linear, its type in each mix (together every type the kernel reads)
MIXES = {
    "k-types": {"attn_q": "Q4_K", "attn_k": "Q5_K", "attn_v": "Q6_K", "attn_output": "Q8_0", "ffn_gate": "Q4_0",
                "ffn_up": "Q5_0", "ffn_down": "Q4_K", "token_embd": "Q6_K", "output": "Q8_0"},
    "legacy": {"attn_q": "Q4_1", "attn_k": "Q5_1", "attn_v": "Q8_0", "attn_output": "F16", "ffn_gate": "BF16",
               "ffn_up": "Q4_0", "ffn_down": "Q5_0", "token_embd": "Q8_0", "output": "F32"},
    # what llama-quantize writes for IQ4_XS (IQ4_NL where a row is not whole blocks of 256),
    # and Q3_K (Q3_K_M's type)
    "iq4-q3k": {"attn_q": "IQ4_XS", "attn_k": "IQ4_NL", "attn_v": "Q3_K", "attn_output": "IQ4_NL", "ffn_gate": "IQ4_XS",
            "ffn_up": "IQ4_NL", "ffn_down": "IQ4_XS", "token_embd": "Q8_0", "output": "IQ4_XS"},
    # what llama-quantize writes for Q2_K: Q2_K, with Q3_K / Q4_K / Q6_K where it keeps more bits
    "q2k": {"attn_q": "Q2_K", "attn_k": "Q2_K", "attn_v": "Q3_K", "attn_output": "Q3_K", "ffn_gate": "Q2_K",
            "ffn_up": "Q2_K", "ffn_down": "Q4_K", "token_embd": "Q2_K", "output": "Q6_K"},
}
#: gguf can quantize these from float weights; K-types get random blocks (it has no K quantizer)
_FROM_FLOAT = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
IDS = [3, 17, 5, 99, 42, 8, 64, 11, 23]


def tiny_hf(kind: str, path, tie: bool):
    """A tiny random model whose rows are whole K-type blocks (256)."""
    return make_tiny_hf_model(kind, path, tie=tie, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                              head_dim=64)


def write_mixed_gguf(hf, kind: str, path, mix: dict[str, str], make_blocks=random_blocks) -> None:
    cfg = hf.config
    w = gguf.GGUFWriter(str(path), kind)
    write_header(w, cfg, kind)
    sd = {k: v.detach().float().numpy() for k, v in hf.state_dict().items()}
    seed = iter(range(1000))

    def put(name: str, a: np.ndarray, qtype: str | None) -> None:
        if qtype is None or a.ndim != 2:
            w.add_tensor(name, np.ascontiguousarray(a))
        elif qtype in _FROM_FLOAT:
            t = gguf.GGMLQuantizationType[qtype]
            w.add_tensor(name, gguf.quants.quantize(a, t), raw_dtype=t)
        elif qtype in ("F16", "F32"):
            w.add_tensor(name, np.ascontiguousarray(a.astype(np.float16 if qtype == "F16" else np.float32)))
        else:  # K-types and BF16: blocks written as raw bytes
            rows, k = a.shape
            blocks = make_blocks(qtype, rows, k, seed=next(seed), exponents=(-12, -9)).numpy()
            if qtype == "BF16":
                blocks = torch.from_numpy(a).to(torch.bfloat16).view(torch.uint8).numpy().reshape(rows, -1)
            w.add_tensor(name, blocks, raw_dtype=gguf.GGMLQuantizationType[qtype])

    put("token_embd.weight", sd["model.embed_tokens.weight"], mix["token_embd"])
    put("output_norm.weight", sd["model.norm.weight"], None)
    if not cfg.tie_word_embeddings:
        put("output.weight", sd["lm_head.weight"], mix["output"])
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "q_norm": "attn_q_norm", "k_norm": "attn_k_norm", "gate_proj": "ffn_gate", "up_proj": "ffn_up",
             "down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for key, a in sd.items():
        parts = key.split(".")
        if parts[1] != "layers":
            continue
        i, mod, kind_ = parts[2], parts[-2], parts[-1]
        if kind == "llama" and mod in ("q_proj", "k_proj"):
            a = _llama_permute(a, cfg.num_attention_heads if mod == "q_proj" else cfg.num_key_value_heads)
        put(f"blk.{i}.{names[mod]}.{kind_}", a, mix.get(names[mod]) if kind_ == "weight" else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))


def _transformers_fp32(tmp_path, path, kind, hf):
    from transformers import AutoModelForCausalLM

    extra = {"head_dim": hf.config.head_dim} if kind == "qwen3" else {}
    return AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32,
                                                **extra).eval()


@pytest.mark.parametrize("kind,tie", [("llama", False), ("qwen2", True), ("qwen3", False)])
@pytest.mark.parametrize("mix", list(MIXES))
def test_quantized_file_is_served_as_stored_and_equals_transformers(tmp_path, kind, tie, mix):
    from dspark.generate import generate_plain
    from dspark.runtime.target import Target
    from dspark.sampling import SamplingParams

    hf = tiny_hf(kind, tmp_path / "hf", tie)
    path = tmp_path / f"tiny-{kind}-{mix}.gguf"
    write_mixed_gguf(hf, kind, path, MIXES[mix])
    said: list[str] = []
    auto = Target.load(str(path), dtype="auto", device="cpu", max_len=128, log=said.append)
    # auto keeps the file's blocks: gguf, or q8x where its int8 products measure faster
    assert auto.precision in ("gguf", "q8x")
    assert any(line.startswith(f"dtype auto: {auto.precision} (") for line in said), said
    assert any(line.startswith(f"dtype {auto.precision}: the file's blocks as stored") for line in said), said
    target = Target.load(str(path), dtype="gguf", device="cpu", max_len=128)
    assert target.precision == "gguf"
    ref = _transformers_fp32(tmp_path, path, kind, hf)
    with torch.no_grad():
        want = ref(torch.tensor([IDS])).logits[0]
    ours = _logits(target.model, IDS)
    # fp32 sums in another order: differences of a few ulps of the largest logit
    torch.testing.assert_close(ours, want, atol=1e-5 * float(want.abs().max()), rtol=1e-4)
    # greedy decoding: transformers fp32 on the file, token for token
    out = generate_plain(target, IDS, SamplingParams(max_tokens=12, ignore_eos=True)).token_ids
    with torch.no_grad():
        hf_ids = ref.generate(torch.tensor([IDS]), max_new_tokens=12, do_sample=False, min_new_tokens=12)[0]
    assert out == hf_ids[len(IDS):].tolist()


def test_a_step_gives_each_row_the_bits_of_decoding_it_alone(tmp_path):
    """Verification and chunked prefill run several rows through one step: each row's
    logits are those of the one-row steps that plain decoding runs."""
    from dspark.runtime.batch import FlatBatch
    from dspark.runtime.kv_cache import KVCachePool

    hf = tiny_hf("qwen2", tmp_path / "hf", tie=True)
    path = tmp_path / "tiny.gguf"
    write_mixed_gguf(hf, "qwen2", path, MIXES["k-types"])
    from dspark.runtime.loader import resolve_model_path

    model = load_transformer(resolve_model_path(str(path)), "gguf")
    whole = _logits(model, IDS)
    cache = KVCachePool(model.cfg, 1, 64, model.dtype, model.device)
    rows = []
    for i, t in enumerate(IDS):
        rows.append(model(FlatBatch(torch.tensor([t]), torch.tensor([i]), [0], [0, 1]), cache)[0][0])
    assert torch.equal(torch.stack(rows), whole)


@pytest.mark.parametrize("dtype", ["gguf", "q8x"])
def test_a_quantized_target_holds_no_dense_copy_of_its_linears(tmp_path, dtype):
    """Served from the file's blocks, a target never loads the checkpoint's fp32 copies of
    its linears (their weights stay on the meta device: four bytes a weight no longer sit
    beside the blocks); where a dense weight is asked for (autograd through the target,
    `--init target`, a drafter's LM head rows) it is the blocks dequantized, exactly the
    checkpoint's values."""
    from transformers import AutoModelForCausalLM

    from dspark.drafters import create_drafter
    from dspark.runtime.target import Target
    from dspark.runtime.weight_formats import dense_weight
    from dspark.train.init import init_from_target

    hf = tiny_hf("llama", tmp_path / "hf", tie=False)
    path = tmp_path / "tiny.gguf"
    write_mixed_gguf(hf, "llama", path, MIXES["k-types"])
    target = Target.load(str(path), dtype=dtype, device="cpu", max_len=128)
    model = target.model
    assert target.precision == dtype
    assert all(model.layers[i].qkv_proj.weight.is_meta and model.layers[i].down_proj.weight.is_meta
               for i in range(2)) and model.lm_head.weight.is_meta
    assert not model.embed_tokens.weight.is_meta and not model.norm.weight.is_meta
    # transformers' own conversion of the file: a Llama file's q and k rows permuted back
    sd = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).state_dict()
    a = "model.layers.1.self_attn."
    qkv = torch.cat([sd[a + p + "_proj.weight"] for p in "qkv"])
    o, head = sd[a + "o_proj.weight"], sd["lm_head.weight"]
    assert torch.equal(dense_weight(model.layers[1].qkv_proj), qkv)
    assert torch.equal(dense_weight(model.lm_head), head)
    # autograd through a served linear: the gradient of the dense weight
    x = torch.randn(3, o.shape[1], requires_grad=True)
    model.layers[1].o_proj(x).sum().backward()
    torch.testing.assert_close(x.grad, o.sum(0).expand(3, -1))
    # --init target copies the dequantized weights
    d = create_drafter("dspark", target, seed=1, dtype=torch.float32, markov_rank=8, block_size=4,
                       num_hidden_layers=1, target_layer_ids=[0])
    init_from_target(d, model)
    assert torch.equal(d.layers[0].self_attn.o_proj.weight, o)


@pytest.mark.parametrize("kind,tie", [("llama", False), ("qwen2", True)])
def test_a_users_file_is_converted_as_blocks_and_made_dense_when_asked(tmp_path, kind, tie):
    """A user's quantized file is converted tensor by tensor: its linears stay blocks only
    (the checkpoint holds the embeddings, norms and biases); a precision that computes with
    dense weights completes the checkpoint, which then equals transformers' own conversion
    of the file tensor for tensor, bit for bit (a Llama file's q and k rows permuted back)."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from dspark.runtime.loader import resolve_model_path

    hf = tiny_hf(kind, tmp_path / "hf", tie)
    path = tmp_path / "tiny.gguf"
    write_mixed_gguf(hf, kind, path, MIXES["k-types"])
    d = resolve_model_path(str(path))
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        lean = set(f.keys())
    assert "model.embed_tokens.weight" in lean and "model.norm.weight" in lean
    assert not any(k.endswith(("_proj.weight",)) for k in lean) and "lm_head.weight" not in lean
    assert json.loads((d / "quantized.json").read_text())["dense"] is False
    model = load_transformer(d, "fp32")  # dense: the checkpoint is completed first
    assert json.loads((d / "quantized.json").read_text())["dense"] is True
    extra = {"head_dim": hf.config.head_dim} if kind == "qwen3" else {}
    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32, **extra)
    want = {k: v for k, v in ref.state_dict().items() if not (tie and k == "lm_head.weight")}
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        assert set(f.keys()) == set(want)
        for k, v in want.items():
            assert torch.equal(f.get_tensor(k).view(torch.int32), v.contiguous().view(torch.int32)), k
    with torch.no_grad():
        logits = ref.eval()(torch.tensor([IDS])).logits[0]
    # fp32 sums in another order: differences of a few ulps of the largest logit
    torch.testing.assert_close(_logits(model, IDS), logits, atol=1e-5 * float(logits.abs().max()), rtol=1e-4)


def test_a_q2k_file_is_served_in_gguf_and_q8x_says_why(tmp_path):
    from dspark.runtime.loader import resolve_model_path

    hf = tiny_hf("llama", tmp_path / "hf", tie=False)
    path = tmp_path / "q2k.gguf"
    write_mixed_gguf(hf, "llama", path, MIXES["q2k"])
    model_dir = resolve_model_path(str(path))
    said: list[str] = []
    assert load_transformer(model_dir, "auto", log=said.append).precision == "gguf"
    assert any("Q2_K tensors have no q8x form" in line for line in said), said
    with pytest.raises(QuantError, match="Q2_K blocks have no q8x form"):
        load_transformer(model_dir, "q8x")


def test_a_type_the_kernel_cannot_read_is_named(tmp_path):
    from dspark.runtime.loader import resolve_model_path

    hf = tiny_hf("qwen2", tmp_path / "hf", tie=True)
    path = tmp_path / "iq2.gguf"
    mix = dict(MIXES["k-types"], ffn_down="IQ2_XXS")
    write_mixed_gguf(hf, "qwen2", path, mix, make_blocks=iq2_or_random_blocks)
    model_dir = resolve_model_path(str(path))
    with pytest.raises(QuantError, match=r"blk\.0\.ffn_down\.weight is IQ2_XXS"):
        load_transformer(model_dir, "auto")
    assert load_transformer(model_dir, "fp32").precision == "fp32"  # dequantized when asked
    # the refusal is kept with the types read then; one from a kernel that read fewer is
    # looked at again (a file refused before IQ4_NL/IQ4_XS were read is served after)
    note = model_dir / "quantized.json"
    assert json.loads(note.read_text())["reads"] == list(TYPES)
    note.write_text(json.dumps({"unreadable": "an older refusal"}))
    assert resolve_model_path(str(path)) == model_dir
    again = json.loads(note.read_text())
    assert again["reads"] == list(TYPES) and "blk.0.ffn_down.weight is IQ2_XXS" in again["unreadable"]


def iq2_or_random_blocks(qtype, rows, k, seed=0, exponents=(-12, -9)):
    """IQ2_XXS raw blocks (gguf dequantizes them; the kernel does not read them) with
    finite fp16 scales; other types as `random_blocks`."""
    if qtype != "IQ2_XXS":
        return random_blocks(qtype, rows, k, seed, exponents)
    raw = np.random.default_rng(seed).integers(0, 256, size=(rows * k // 256, 66), dtype=np.uint8)
    raw[:, 0:2] = np.full((raw.shape[0], 1), 2.0 ** -10, dtype=np.float16).view(np.uint8)
    return torch.from_numpy(raw.reshape(rows, -1).copy())
