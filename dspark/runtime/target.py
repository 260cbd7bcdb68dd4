"""The target model as users load it: weights, tokenizer, dtype and device together."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from .kv_cache import KVCachePool
from .loader import default_device, load_transformer, resolve_model_path
from .model import Transformer
from .tokenizer import Tokenizer


@dataclass
class Target:
    model: Transformer
    tokenizer: Tokenizer
    path: Path
    name: str
    #: "default" for the default model in any of its files (the drafters shipped for
    #: it draft for all of them), else the model's name
    family: str = ""

    def __post_init__(self) -> None:
        self.family = self.family or self.name

    @classmethod
    def load(
        cls,
        model: str | None = None,
        dtype: str | None = "auto",
        device: str | None = None,
        max_len: int = 4096,
        threads: int | None = None,
        log=None,
    ) -> "Target":
        """`dtype`: auto, bf16, fp16, fp32 or bf16w (bf16 weights, fp32 compute; the
        native AVX2 kernel). auto is bf16 on accelerators; on a CPU it measures the
        candidates for this model and prints its pick to stderr (or to `log`)."""
        if threads:
            torch.set_num_threads(threads)
        path = resolve_model_path(model)
        dev = torch.device(device) if device else default_device()
        if log is None:
            def log(line: str) -> None:
                print(line, file=sys.stderr, flush=True)
        net = load_transformer(path, dtype or "auto", dev, max_len=max_len, log=log)
        tok = Tokenizer(path, extra_eos_ids=net.cfg.eos_token_ids)
        name = "default" if model in (None, "", "default") else Path(model).name
        target = cls(net, tok, path, name)
        if name != "default":
            from .default_model import is_default_model

            target.family = "default" if is_default_model(path) else name
        return target

    @property
    def cfg(self):
        return self.model.cfg

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def precision(self) -> str:
        return self.model.precision

    def new_cache(self, num_slots: int, max_len: int) -> KVCachePool:
        return KVCachePool(self.cfg, num_slots, max_len, self.dtype, self.device)
