"""Load a Hugging Face model directory (config.json + safetensors) into `Transformer`.

Only safetensors are read: no pickle, no remote code. `--model default` (or no model)
resolves to the embedded SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from .config import ConfigError, ModelConfig
from .model import Transformer, pack_cpu_bf16_linears


class ModelLoadError(ValueError):
    pass


def resolve_model_path(model: str | None) -> Path:
    if model in (None, "", "default"):
        from .default_model import default_model_dir

        return default_model_dir()
    p = Path(model).expanduser()
    if not p.is_dir():
        raise ModelLoadError(
            f"model path {model!r} is not a directory; pass a Hugging Face model directory "
            "(config.json + *.safetensors) or 'default'"
        )
    return p


def default_dtype(device: torch.device | str) -> torch.dtype:
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if cpu_has_bf16() else torch.float32


def cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def parse_dtype(name: str | None, device: torch.device | str) -> torch.dtype:
    if name in (None, "auto"):
        return default_dtype(device)
    table = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32,
             "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16}
    if name not in table:
        raise ValueError(f"unknown dtype {name!r}; choose auto, bf16, fp16 or fp32")
    return table[name]


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def read_safetensors_dir(path: Path, error: type[Exception] = ModelLoadError) -> dict[str, torch.Tensor]:
    """Every tensor of a directory's safetensors files (sharded via the index file
    when present). Raises `error` for a missing, corrupt or truncated file; never
    falls back to pickled formats."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = [path / n for n in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise error(f"{path} holds no *.safetensors file (pickled checkpoints are not loaded)")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                for k in fh.keys():
                    out[k] = fh.get_tensor(k)
        except Exception as e:  # corrupt or truncated file
            raise error(f"cannot read {f}: {e}") from None
    return out


def fuse_hf_state_dict(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map HF parameter names onto `Transformer`'s fused layout."""

    def take(name: str) -> torch.Tensor:
        for key in (name, name.removeprefix("model.")):
            if key in sd:
                return sd[key]
        raise ModelLoadError(f"weight {name!r} missing from the checkpoint")

    out = {"embed_tokens.weight": take("model.embed_tokens.weight"), "norm.weight": take("model.norm.weight")}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = sd.get("lm_head.weight", out["embed_tokens.weight"])
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        out[f"layers.{i}.qkv_proj.weight"] = torch.cat(
            [take(a + "q_proj.weight"), take(a + "k_proj.weight"), take(a + "v_proj.weight")]
        )
        if cfg.qkv_bias:
            out[f"layers.{i}.qkv_proj.bias"] = torch.cat(
                [take(a + "q_proj.bias"), take(a + "k_proj.bias"), take(a + "v_proj.bias")]
            )
        out[f"layers.{i}.o_proj.weight"] = take(a + "o_proj.weight")
        if cfg.qk_norm:
            out[f"layers.{i}.q_norm.weight"] = take(a + "q_norm.weight")
            out[f"layers.{i}.k_norm.weight"] = take(a + "k_norm.weight")
        m = p + "mlp."
        out[f"layers.{i}.gate_up_proj.weight"] = torch.cat([take(m + "gate_proj.weight"), take(m + "up_proj.weight")])
        out[f"layers.{i}.down_proj.weight"] = take(m + "down_proj.weight")
        out[f"layers.{i}.input_layernorm.weight"] = take(p + "input_layernorm.weight")
        out[f"layers.{i}.post_attention_layernorm.weight"] = take(p + "post_attention_layernorm.weight")
    return out


def load_transformer(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    max_len: int | None = None,
) -> Transformer:
    path = Path(path)
    try:
        cfg = ModelConfig.from_dir(path)
    except ConfigError as e:
        raise ModelLoadError(str(e)) from None
    sd = fuse_hf_state_dict(cfg, read_safetensors_dir(path))
    with torch.device("meta"):
        model = Transformer(cfg, max_len=1)
    model.load_state_dict(sd, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ModelLoadError(f"weights missing from {path}: {missing[:5]}")
    model._rope_len = 0
    model.rope_cos = torch.empty(0)
    model.rope_sin = torch.empty(0)
    model = model.to(device=device, dtype=dtype)
    model.ensure_rope(max_len or min(cfg.max_position_embeddings, 4096))
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    pack_cpu_bf16_linears(model)
    return model
