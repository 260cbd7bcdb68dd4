"""Shared fixtures: the real default model (loaded once per session) and tiny
random Llama-family models written as Hugging Face directories."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def default_target_fp32():
    from dspark.runtime.target import Target

    return Target.load("default", dtype="fp32", device="cpu", max_len=1024)


@pytest.fixture(scope="session")
def default_target_bf16w():
    """The default model with bf16 weights and fp32 compute (the native kernel), the
    precision `--dtype auto` picks on CPUs without avx512_bf16."""
    from dspark.runtime import cpu_kernels
    from dspark.runtime.target import Target

    if not cpu_kernels.available():
        pytest.skip(f"native kernel unavailable: {cpu_kernels.why_unavailable()}")
    return Target.load("default", dtype="bf16w", device="cpu", max_len=1024)


@pytest.fixture(scope="session")
def default_target_bf16x():
    """The default model with bf16 weights and matmul inputs rounded to bf16 (AMX or
    avx512_bf16 kernels); only on CPUs that have them (see `BF16X_PRECISIONS`)."""
    from dspark.runtime.target import Target

    return Target.load("default", dtype="bf16x", device="cpu", max_len=1024)


def bf16x_available() -> bool:
    from dspark.runtime import cpu_matmul

    return cpu_matmul.bf16x_kernel() is not None


#: the bf16x precision where this CPU runs it: tests parametrized over precisions take it
#: only there (an AVX2-only CPU has no such kernel to test)
BF16X_PRECISIONS = ["bf16x"] if bf16x_available() else []


@pytest.fixture(scope="session")
def default_target():
    """The default model in the runtime's default dtype (measured at load: bf16x or bf16w
    on these CPUs)."""
    from dspark.runtime.target import Target

    return Target.load("default", device="cpu", max_len=1024)


@pytest.fixture(scope="session")
def default_target_gguf():
    """The default model's Q4_1 file served as stored (the gguf precision: what `auto`
    picks for a user's quantized file)."""
    from dspark.runtime.target import Target

    target = Target.load("default", dtype="gguf", device="cpu", max_len=1024)
    assert target.precision == "gguf"
    return target


@pytest.fixture(scope="session")
def default_target_q8x():
    """The default model's Q4_1 file with int8 activations (the q8x precision)."""
    from dspark.runtime.target import Target

    target = Target.load("default", dtype="q8x", device="cpu", max_len=1024)
    assert target.precision == "q8x"
    return target


def make_tiny_hf_model(kind: str, path, seed: int = 0, tie: bool = False, head_dim: int = 16, **sizes):
    """Write a tiny random HF model of `kind` (llama/qwen2/qwen3) to `path`; returns the HF
    model. `sizes`: config fields other than the defaults below (hidden_size, ...);
    `head_dim`: Qwen3's."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    torch.manual_seed(seed)
    common = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  tie_word_embeddings=tie, rms_norm_eps=1e-6)
    common.update(sizes)
    if kind == "llama":
        cfg = LlamaConfig(**common, rope_theta=10000.0)
    elif kind == "qwen2":
        cfg = Qwen2Config(**common, rope_theta=1000000.0)
    elif kind == "qwen3":
        cfg = Qwen3Config(**common, head_dim=head_dim, rope_theta=1000000.0)
    else:
        raise ValueError(kind)
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    # Random norm weights and biases so a wrongly applied norm/bias cannot hide.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(str(path), safe_serialization=True)
    return model


@pytest.fixture(params=["llama", "qwen2", "qwen3"])
def tiny_hf(request, tmp_path):
    model = make_tiny_hf_model(request.param, tmp_path / request.param)
    return request.param, tmp_path / request.param, model


def drafter_after_prompt(target, drafter, prompt: str):
    """`drafter` holding one request "r" whose context is `prompt` (chat-templated) run
    through `target`; returns (prompt ids, the target's next token: the anchor)."""
    from dspark.runtime.batch import FlatBatch

    ids = target.tokenizer.chat_prompt(prompt)
    cache = target.new_cache(1, 256)
    batch = FlatBatch.from_requests([ids], [0], [cache.allocate(0)], logits="last")
    logits, hidden = target.model(batch, cache, hidden_layers=drafter.target_layer_ids)
    drafter.add_request("r")
    drafter.append_context(["r"], [ids], [0], hidden)
    return ids, int(logits[0].argmax())
