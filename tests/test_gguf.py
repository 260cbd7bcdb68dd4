"""GGUF files as models: a tiny GGUF of each supported architecture, written here from
a tiny random HF model, loads through `--model FILE.gguf` and computes what the model
it was written from computes; quantized, what transformers computes on the same
file; files that cannot be read get a message, never a traceback."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import make_tiny_hf_model
from dspark.runtime.gguf_model import GgufError, check_gguf
from dspark.runtime.loader import ModelLoadError, load_transformer, resolve_model_path
from test_loading import _logits

gguf = pytest.importorskip("gguf")

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _vocab() -> tuple[list[str], list[str]]:
    """101 byte-level BPE tokens (printable ASCII, a space and three merges) + specials."""
    tokens = [chr(c) for c in range(33, 127)] + ["Ġ", "Ġa", "th", "he"] + SPECIAL
    assert len(tokens) == 101
    return tokens, ["Ġ a", "t h", "h e"]


def _llama_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """HF q/k rows -> llama.cpp's rotary order (transformers undoes this on load)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_header(w, cfg, kind: str) -> None:
    """A tiny model's hyper-parameters and tokenizer (byte-level BPE, ChatML) into a GGUF writer."""
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_theta if hasattr(cfg, "rope_theta") else cfg.rope_parameters["rope_theta"])
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_vocab_size(cfg.vocab_size)
    tokens, merges = _vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if kind != "llama" else "default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIAL else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_chat_template(CHATML)


def write_tiny_gguf(hf, kind: str, path, qtype=None, arch: str | None = None) -> None:
    cfg = hf.config
    arch = arch or kind
    w = gguf.GGUFWriter(str(path), arch)
    write_header(w, cfg, kind)
    sd = {k: v.detach().float().numpy() for k, v in hf.state_dict().items()}

    def put(name: str, a: np.ndarray) -> None:
        if qtype is not None and a.ndim == 2:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, np.ascontiguousarray(a))

    put("token_embd.weight", sd["model.embed_tokens.weight"])
    put("output_norm.weight", sd["model.norm.weight"])
    if not cfg.tie_word_embeddings:
        put("output.weight", sd["lm_head.weight"])
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
        put(f"blk.{i}.{names[mod]}.{kind_}", a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


IDS = [3, 17, 5, 99, 42, 8, 64]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("kind,tie", [("llama", False), ("qwen2", True), ("qwen3", False)])
def test_gguf_matches_the_model_it_was_written_from(tmp_path, kind, tie):
    hf = make_tiny_hf_model(kind, tmp_path / "hf", tie=tie)
    path = tmp_path / f"tiny-{kind}.gguf"
    write_tiny_gguf(hf, kind, path)
    assert check_gguf(path) == kind
    model_dir = resolve_model_path(str(path))
    assert resolve_model_path(str(path)) == model_dir  # converted once
    ours = _logits(load_transformer(model_dir, torch.float32), IDS)
    with torch.no_grad():
        want = hf(torch.tensor([IDS])).logits[0]
    torch.testing.assert_close(ours, want, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_quantized_gguf_matches_transformers(tmp_path, kind):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dspark.runtime.target import Target

    hf = make_tiny_hf_model(kind, tmp_path / "hf")
    path = tmp_path / f"tiny-{kind}-q8.gguf"
    write_tiny_gguf(hf, kind, path, qtype=gguf.GGMLQuantizationType.Q8_0)
    target = Target.load(str(path), dtype="fp32", device="cpu", max_len=64)
    # transformers reads no head size from a Qwen3 GGUF (it assumes 128): told here
    extra = {"head_dim": hf.config.head_dim} if kind == "qwen3" else {}
    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32,
                                               **extra).eval()
    with torch.no_grad():
        want = ref(torch.tensor([IDS])).logits[0]
        plain = hf(torch.tensor([IDS])).logits[0]
    ours = _logits(target.model, IDS)
    torch.testing.assert_close(ours, want, atol=2e-4, rtol=1e-4)
    assert not torch.allclose(ours, plain, atol=1e-4)  # quantized: the comparison above had to dequantize
    tok = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    msgs = [{"role": "user", "content": "the hat"}]
    want_ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    want_ids = list(want_ids["input_ids"] if hasattr(want_ids, "keys") else want_ids)
    assert target.tokenizer.apply_chat_template(msgs) == want_ids
    assert target.tokenizer.eos_token_ids == [tok.convert_tokens_to_ids("<|im_end|>")]


def test_unreadable_gguf_files_say_why(tmp_path, capsys):
    from dspark.cli.main import main

    hf = make_tiny_hf_model("llama", tmp_path / "hf")
    other = tmp_path / "gpt2.gguf"
    write_tiny_gguf(hf, "llama", other, arch="gpt2")
    with pytest.raises(GgufError, match="architecture 'gpt2' is not supported"):
        resolve_model_path(str(other))
    # A quantization the installed gguf cannot dequantize (Q8_1 has no dequantizer).
    bad = tmp_path / "q81.gguf"
    w = gguf.GGUFWriter(str(bad), "llama")
    q81 = gguf.GGMLQuantizationType.Q8_1
    w.add_tensor("token_embd.weight", np.zeros((4, gguf.GGML_QUANT_SIZES[q81][1] * 2), dtype=np.uint8),
                 raw_dtype=q81)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GgufError, match="quantized as Q8_1"):
        resolve_model_path(str(bad))
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(other.read_bytes()[:200])
    with pytest.raises(GgufError, match="cannot read"):
        resolve_model_path(str(truncated))
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        resolve_model_path(str(text))
    assert main(["generate", "hi", "--model", str(other), "--max-tokens", "1"]) != 0
    err = capsys.readouterr().err
    assert "architecture 'gpt2' is not supported" in err and "Traceback" not in err
