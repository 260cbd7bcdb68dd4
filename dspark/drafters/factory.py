"""Building drafters: the method -> class table and fresh random initialisation."""

from __future__ import annotations

import torch
from torch import nn

from dspark.runtime.model import RMSNorm

from .base import Drafter
from .config import DrafterConfig, DrafterConfigError
from .target_parts import TargetParts

INIT_STD = 0.02


def drafter_class(method: str) -> type[Drafter]:
    from .autoregressive import Eagle3Drafter, MTPDrafter
    from .dspark import DSparkDrafter

    return {"dspark": DSparkDrafter, "dflash": DSparkDrafter, "eagle3": Eagle3Drafter, "mtp": MTPDrafter}[method]


def build_drafter(config: DrafterConfig, target: TargetParts) -> Drafter:
    """The drafter module for `config` with uninitialised weights (on the current
    default device; `load_drafter` builds it on the meta device)."""
    return drafter_class(config.method)(config, target)


def init_weights(drafter: nn.Module, target: TargetParts, seed: int) -> None:
    """Normal(0, 0.02) linears and Markov embedding, zero biases, unit norms; the
    final `norm` starts as a copy of the target's final norm."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in drafter.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.copy_(torch.randn(module.weight.shape, generator=g) * INIT_STD)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
        drafter.norm.weight.copy_(target.final_norm_weight.float())


def create_drafter(
    method: str,
    target_model,
    *,
    seed: int = 0,
    dtype: torch.dtype | None = None,
    draft_token_ids: list[int] | None = None,
    **sizes,
) -> Drafter:
    """A freshly initialised drafter for `target_model` (a `Transformer` or `Target`).

    `method`: dspark, dflash, eagle3, mtp or ngram. `sizes` override any
    `DrafterConfig` field (e.g. num_hidden_layers=1, markov_rank=32, block_size=8,
    target_layer_ids=[...]); for ngram they go to `NgramDrafter`. Weights are seeded
    by `seed` and placed on the target's device in `dtype` (default: the target's).
    With `draft_vocab_size=N` the drafter gets its own LM head over the target tokens
    `draft_token_ids` (N ids, e.g. the most frequent of the training responses, see
    `dspark.train.vocab`; default: ids 0..N-1), started from the target's rows.
    """
    if method == "ngram":
        from .ngram import NgramDrafter

        return NgramDrafter(**sizes)
    target = TargetParts.of(target_model)
    config = DrafterConfig.for_target(method, target.cfg, tokenizer=target.tokenizer, **sizes)
    problems = config.check_target(target.cfg)
    if problems:
        raise DrafterConfigError("drafter does not fit the target: " + "; ".join(problems))
    with torch.device("cpu"):
        drafter = build_drafter(config, target)
    drafter.float()
    init_weights(drafter, target, seed)
    if config.reduced_vocab:
        ids = list(range(config.draft_vocab_size)) if draft_token_ids is None else draft_token_ids
        drafter.set_draft_vocab(ids)
    elif draft_token_ids is not None:
        raise DrafterConfigError("draft_token_ids given without a reduced draft_vocab_size")
    return drafter.to(device=target.device, dtype=dtype or target.dtype).eval()
