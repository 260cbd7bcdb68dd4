"""Model configuration for the Llama family (Llama, SmolLM2, Qwen2, Qwen3).

One dataclass covers every supported architecture; the per-architecture differences
are two switches (`qkv_bias` for Qwen2, `qk_norm` for Qwen3) derived from the Hugging
Face `config.json` in `from_hf`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from dspark.errors import UserError

# HF `model_type` -> (qkv_bias, qk_norm)
ARCHITECTURES: dict[str, tuple[bool, bool]] = {
    "llama": (False, False),
    "mistral": (False, False),
    "qwen2": (True, False),
    "qwen3": (False, True),
}


class ConfigError(UserError, ValueError):
    pass


@dataclass
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int = 0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            self.head_dim = self.hidden_size // self.num_heads
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        model_type = cfg.get("model_type", "")
        if model_type not in ARCHITECTURES:
            raise ConfigError(
                f"unsupported model_type {model_type!r}; supported: {sorted(ARCHITECTURES)}"
            )
        qkv_bias, qk_norm = ARCHITECTURES[model_type]
        if model_type == "llama":
            qkv_bias = bool(cfg.get("attention_bias", False))
        rope = cfg.get("rope_parameters") or {}
        theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
        scaling = cfg.get("rope_scaling") or (
            rope if rope.get("rope_type", "default") != "default" else None
        )
        if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default", "llama3", "linear"):
            raise ConfigError(f"unsupported rope scaling {scaling!r}")
        eos = cfg.get("eos_token_id")
        eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        return cls(
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=cfg["num_attention_heads"],
            num_kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
            head_dim=cfg.get("head_dim") or 0,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            eos_token_ids=eos_ids,
            bos_token_id=cfg.get("bos_token_id"),
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelConfig":
        p = Path(path) / "config.json"
        try:
            return cls.from_hf(json.loads(p.read_text()))
        except FileNotFoundError:
            raise ConfigError(f"{p} not found: a model directory needs config.json") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p} is not valid JSON: {e}") from None
        except KeyError as e:
            raise ConfigError(f"{p} lacks the field {e.args[0]!r}") from None
