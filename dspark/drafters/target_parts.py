"""What a drafter borrows from the target: its embedding and LM head (frozen, shared,
never saved with the drafter) and its configuration."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dspark.runtime.config import ModelConfig
from dspark.runtime.model import Transformer


@dataclass(frozen=True, eq=False)
class TargetParts:
    """Held by a drafter as a plain attribute, so the target's modules are neither
    registered as drafter parameters nor written to its state dict."""

    cfg: ModelConfig
    embed_tokens: nn.Embedding
    lm_head: nn.Linear
    final_norm_weight: torch.Tensor  # [hidden], to initialise a fresh drafter's `norm`
    tokenizer: object | None = None

    @classmethod
    def of(cls, target: "Transformer | object") -> "TargetParts":
        """From a runtime `Transformer` or a `Target` (model + tokenizer)."""
        model = getattr(target, "model", target)
        if not isinstance(model, Transformer):
            raise TypeError(f"expected a dspark Transformer or Target, got {type(target).__name__}")
        return cls(model.cfg, model.embed_tokens, model.lm_head, model.norm.weight, getattr(target, "tokenizer", None))

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def embed(self, token_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[...] int64 -> [..., hidden] in the drafter's dtype."""
        return self.embed_tokens(token_ids.to(self.device)).to(dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Already-normed drafter hidden [..., hidden] -> fp32 logits [..., vocab]."""
        return self.lm_head(hidden.to(self.dtype)).float()

    @property
    def dtype(self) -> torch.dtype:
        """The target's compute dtype (its weights may be stored narrower: bf16w)."""
        return self.final_norm_weight.dtype
