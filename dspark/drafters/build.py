"""The drafter a speculative configuration names, built and placed on the target.

The engine's `SpeculativeConfig` says *which* drafter (a method, a checkpoint, hybrid
lookup, priced lookup, the reply history); this module knows *how* to make one: which
constructor, which weight format matches the target's precision, which wrapper. The
configuration is read by attribute (`DrafterSpec`), so drafters import nothing of the
engine that sits above them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from .base import Drafter


class DrafterSpec(Protocol):
    """What building a drafter reads of a speculative configuration
    (`dspark.engine.config.SpeculativeConfig` is one)."""

    method: str
    num_speculative_tokens: int | None
    markov_candidates: int | None
    prompt_lookup_max: int
    prompt_lookup_min: int
    lookup: bool
    lookup_calibration: str | None
    lookup_history: bool
    drafter_trust: bool
    drafter_weights: str

    @property
    def priced_lookup(self) -> bool: ...

    def drafter_path(self, target_name: str) -> Path | None: ...


def drafter_from_spec(spec: DrafterSpec, target) -> Drafter:
    """The drafter `spec` names, for `target` (a `dspark.runtime` Target), on its device."""
    from . import create_drafter, load_drafter

    if spec.priced_lookup:
        from .lookup import LookupCalibration
        from .priced_lookup import LookupDrafter

        calibration = LookupCalibration.load(spec.lookup_calibration) if spec.lookup_calibration else None
        return _with_history(spec, LookupDrafter(calibration, spec.prompt_lookup_max, spec.prompt_lookup_min,
                                                 spec.num_speculative_tokens or 7, device=target.device))
    if spec.method == "ngram":
        sizes = {"max_draft_tokens": spec.num_speculative_tokens} if spec.num_speculative_tokens else {}
        return create_drafter("ngram", target.model, max_ngram=spec.prompt_lookup_max,
                              min_ngram=spec.prompt_lookup_min, **sizes)
    from dspark.runtime import cpu_kernels
    from dspark.runtime.precision import QUANTIZED_PRECISIONS
    from dspark.runtime.weight_formats import (pack_cpu_bf16_linears, use_bf16_weights, use_f32_panels, use_q8x_weights,
                                               weight_kind)

    path = spec.drafter_path(getattr(target, "family", target.name))
    if path is None:
        sizes = {"block_size": spec.num_speculative_tokens + 1} \
            if spec.num_speculative_tokens and spec.method in ("dspark", "dflash") else {}
        drafter = create_drafter(spec.method, target.model, seed=0, **sizes)
    else:
        drafter = load_drafter(path, target.model)
    if spec.markov_candidates is not None:
        drafter.markov_candidates = spec.markov_candidates
    drafter.greedy_logits = False  # the engine reads a greedy draft's tokens alone
    precision = getattr(target.model, "precision", None)
    weights = getattr(spec, "drafter_weights", "bf16")
    if weights != "bf16" and target.device.type == "cpu" and cpu_kernels.available():
        use_q8x_weights(drafter, weights)  # its blocks read by the q8x kernel, whatever the target's precision
    if precision in ("bf16w", "bf16x"):
        # the target's weight format for the drafter's linears too: a draft reads its
        # weights once per step, and fp32 weights double that traffic
        use_bf16_weights(drafter, embeddings=False, kind=precision)
    elif precision == "fp32" and weight_kind(target.model.layers[0].qkv_proj) == "f32w":
        use_f32_panels(drafter)  # the target's batch-invariant fp32 kernel (2-3 rows at a row's cost)
    elif precision in QUANTIZED_PRECISIONS and cpu_kernels.available():
        # a quantized target (gguf, q8x): the drafter in bf16w, half the bytes of its fp32
        # weights (its own output need not be batch-invariant: verification is exact)
        use_bf16_weights(drafter, embeddings=False, kind="bf16w")
    else:
        pack_cpu_bf16_linears(drafter)
    if spec.lookup:
        from .hybrid import HybridDrafter
        from .lookup import LookupCalibration

        calibration = LookupCalibration.load(spec.lookup_calibration) if spec.lookup_calibration else None
        drafter = HybridDrafter(drafter, calibration, spec.prompt_lookup_max, spec.prompt_lookup_min)
        drafter.drafter_trust.enabled = spec.drafter_trust
        _with_history(spec, drafter)
    return drafter


def _with_history(spec: DrafterSpec, drafter: Drafter) -> Drafter:
    """`drafter` (a calibrated lookup) with the reply history `spec` asks for."""
    if spec.lookup_history:
        from .reply_history import ReplyHistory

        drafter.reply_history = ReplyHistory()
    return drafter
