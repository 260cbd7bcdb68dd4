"""Sampling parameters and the logits -> probabilities transform.

The same transform (temperature, then top-k, then top-p) is applied to target and
draft logits alike, which the lossless rejection sampler requires. Temperature 0
means greedy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dspark.errors import UserError
from dspark.runtime.cpu_kernels import argmax_rows


class SamplingError(UserError, ValueError):
    pass


@dataclass
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_tokens: int = 256
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise SamplingError(f"temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise SamplingError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise SamplingError(f"top_k must be a non-negative integer (0 = off), got {self.top_k!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise SamplingError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(
    logits: torch.Tensor,  # [..., vocab]
    temperature: float | torch.Tensor,
    top_k: int | torch.Tensor = 0,
    top_p: float | torch.Tensor = 1.0,
) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p (fp32). Rows broadcast
    per-row parameters given as tensors of shape `logits.shape[:-1]`.
    Temperature must be > 0 here; greedy callers take the argmax instead."""
    x = logits.float()
    if isinstance(temperature, torch.Tensor):
        x = x / temperature.unsqueeze(-1)
    else:
        x = x / temperature
    k_any = bool((top_k > 0).any()) if isinstance(top_k, torch.Tensor) else top_k > 0
    p_any = bool((top_p < 1).any()) if isinstance(top_p, torch.Tensor) else top_p < 1
    if k_any or p_any:
        sorted_x, order = x.sort(dim=-1, descending=True)
        v = x.shape[-1]
        ranks = torch.arange(v, device=x.device)
        drop = torch.zeros_like(sorted_x, dtype=torch.bool)
        if k_any:
            k = top_k if isinstance(top_k, torch.Tensor) else torch.full(x.shape[:-1], top_k, device=x.device)
            k = torch.where(k > 0, k, torch.full_like(k, v))
            drop |= ranks >= k.unsqueeze(-1)
        if p_any:
            p = top_p if isinstance(top_p, torch.Tensor) else torch.full(x.shape[:-1], float(top_p), device=x.device)
            probs_sorted = torch.softmax(sorted_x.masked_fill(drop, float("-inf")), dim=-1)
            # Keep the smallest prefix whose mass reaches top_p: a token is dropped
            # when the mass strictly before it already reaches top_p.
            before = probs_sorted.cumsum(-1) - probs_sorted
            drop |= before >= p.unsqueeze(-1)
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = torch.empty_like(x).scatter_(-1, order, sorted_x)
    return torch.softmax(x, dim=-1)


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from a 1-D distribution using a float64 uniform (inverse CDF)."""
    u = torch.rand((), generator=generator, dtype=torch.float64, device=probs.device)
    cdf = probs.double().cumsum(0)
    idx = int(torch.searchsorted(cdf, u * cdf[-1], right=True).item())
    return min(idx, probs.shape[0] - 1)


def sample_rows(logits: torch.Tensor, params: list[SamplingParams],
                generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of `logits` [R, vocab], per row's params: the argmax when
    greedy, else `logits_to_probs` (the transform the verifier applies to the same
    logits) and one float64 uniform from the row's own generator, so a row's draw
    does not depend on the other rows of the batch. The one sampler of the engine's
    drafters and of the plain reference loop. Returns [R] int64."""
    out = argmax_rows(logits)
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if not sampled:
        return out
    dev = logits.device
    rows = torch.tensor(sampled, device=dev)
    ps = [params[i] for i in sampled]
    probs = logits_to_probs(
        logits.index_select(0, rows),
        torch.tensor([p.temperature for p in ps], dtype=torch.float32, device=dev),
        torch.tensor([p.top_k for p in ps], dtype=torch.long, device=dev),
        torch.tensor([p.top_p for p in ps], dtype=torch.float32, device=dev),
    )
    for row, i in enumerate(sampled):
        gen = generators[i]
        # The uniform is drawn on the generator's device (a CPU generator with CUDA logits).
        row_probs = probs[row] if gen is None or gen.device == dev else probs[row].to(gen.device)
        out[i] = sample_from_probs(row_probs, gen)
    return out


class StopRule:
    """When a request stops, decided in one place for every loop: at the first stop
    token (EOS unless `ignore_eos`, and `stop_token_ids`; the token is not part of
    the output), or once the text contains a stop string (the text is cut before it)."""

    def __init__(self, params: SamplingParams, eos_token_ids) -> None:
        self.stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            self.stop_ids.update(eos_token_ids)
        self.stop_strings = [s for s in params.stop if s]

    def stop_token(self, token: int) -> bool:
        return token in self.stop_ids

    def hit_string(self, text: str) -> bool:
        return any(s in text for s in self.stop_strings)

    def cut_text(self, text: str) -> str:
        """`text` up to the first stop string it contains."""
        cut = min((text.find(s) for s in self.stop_strings if s in text), default=-1)
        return text[:cut] if cut >= 0 else text
