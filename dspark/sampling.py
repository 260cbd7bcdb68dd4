"""Sampling parameters and the logits -> probabilities transform.

The same transform (temperature, then top-k, then top-p) is applied to target and
draft logits alike, which the lossless rejection sampler requires. Temperature 0
means greedy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dspark.errors import UserError


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


# Rows whose kept set can be found among their FEW_CAP largest logits skip the
# full-vocabulary sort (about 40x cheaper on a 49k vocabulary): top-k rows with
# k <= FEW_CAP, and top-p rows whose FEW_CAP largest tokens already hold top_p of
# the mass. The width is fixed, so a row's result never depends on the batch.
FEW_CAP = 256


def logits_to_probs(
    logits: torch.Tensor,  # [..., vocab]
    temperature: float | torch.Tensor,
    top_k: int | torch.Tensor = 0,
    top_p: float | torch.Tensor = 1.0,
) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p (fp32). Rows broadcast
    per-row parameters given as tensors of shape `logits.shape[:-1]`.
    Temperature must be > 0 here; greedy callers take the argmax instead.

    Top-k keeps the k largest logits; top-p then keeps the smallest prefix (largest
    first) of what is left whose renormalized mass reaches top_p: a token is dropped
    when the mass strictly before it already does. Each row is computed on its own
    (its result does not depend on the rows beside it): on its FEW_CAP largest
    logits when the kept set lies among them, else on a full sort."""
    x = logits.float()
    lead, v = x.shape[:-1], x.shape[-1]
    x = x.reshape(-1, v)
    n = x.shape[0]

    def per_row(value, dtype) -> torch.Tensor:
        t = value if isinstance(value, torch.Tensor) else torch.tensor(value, device=x.device)
        return t.to(dtype).reshape(-1).expand(n)

    temp = per_row(temperature, torch.float32)
    k, p = per_row(top_k, torch.long), per_row(top_p, torch.float32)
    k = torch.where((k > 0) & (k < v), k, torch.full_like(k, v))  # 0 (off) or >= vocab: every token
    cut = (k < v) | (p < 1)
    if not bool(cut.any()):
        return torch.softmax(x / temp.unsqueeze(-1), dim=-1).reshape(*lead, v)
    if bool(cut.all()):  # the usual case (one request's rows, or a batch sampling alike): no copies
        return _cut_probs(x, temp, k, p).reshape(*lead, v)
    out = torch.empty_like(x)
    rows, rest = cut.nonzero().squeeze(-1), (~cut).nonzero().squeeze(-1)
    out.index_copy_(0, rows, _cut_probs(*(t.index_select(0, rows) for t in (x, temp, k, p))))
    out.index_copy_(0, rest, torch.softmax(x.index_select(0, rest) / temp.index_select(0, rest).unsqueeze(-1), -1))
    return out.reshape(*lead, v)


def _cut_probs(x, temp, k, p) -> torch.Tensor:
    """Rows with top-k or top-p: from their FEW_CAP largest logits where the kept set
    lies there, the others by a full sort."""
    v = x.shape[-1]
    if FEW_CAP >= v:
        return _kept_by_full_sort(x / temp.unsqueeze(-1), k, p)
    probs, ok = _kept_among_largest(x, temp, k, p, FEW_CAP)
    if not bool(ok.all()):
        rows = (~ok).nonzero().squeeze(-1)
        probs.index_copy_(0, rows, _kept_by_full_sort(x.index_select(0, rows) / temp.index_select(0, rows).unsqueeze(-1),
                                                      k.index_select(0, rows), p.index_select(0, rows)))
    return probs


def _top_p_drop(sorted_probs: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Where the mass strictly before a token (largest first) already reaches top_p;
    nothing in rows without top-p (a rounded cumulative sum can reach 1.0 early)."""
    before = sorted_probs.cumsum(-1) - sorted_probs
    return (before >= p.unsqueeze(-1)) & (p < 1).unsqueeze(-1)


def _kept_among_largest(x, temp, k, p, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs [R, V], ok [R]) from each row's `width` largest logits, for the rows whose
    kept set lies among them (ok False: the row needs the full sort). `x` is before
    temperature (dividing by it keeps the order), so only the kept candidates and
    the rows that need the whole vocabulary's mass are divided."""
    v = x.shape[-1]
    fits = k <= width
    whole = ~fits & (k >= v) & (p < 1)  # top-p without top-k: its mass is over the whole vocabulary
    raw, idx = x.topk(width, dim=-1)  # descending
    vals = raw / temp.unsqueeze(-1)
    drop = torch.arange(width, device=x.device) >= k.clamp(max=width).unsqueeze(-1)
    norm = torch.logsumexp(vals.masked_fill(drop, float("-inf")), -1)  # over the top-k set
    if bool(whole.any()):
        w = whole.nonzero().squeeze(-1)
        scaled = x.index_select(0, w) / temp.index_select(0, w).unsqueeze(-1)
        top = vals.index_select(0, w)[:, :1]
        norm = norm.index_copy(0, w, top.squeeze(-1) + scaled.sub_(top).exp_().sum(-1).log())
    sorted_probs = torch.exp(vals - norm.unsqueeze(-1)).masked_fill(drop, 0.0)
    drop |= _top_p_drop(sorted_probs, p)
    # A whole-vocabulary top-p row is decided here only if the width largest hold top_p.
    held = sorted_probs.cumsum(-1)[:, -1]
    ok = fits | (whole & (held >= p))
    probs = torch.zeros_like(x).scatter_(-1, idx, torch.softmax(vals.masked_fill(drop, float("-inf")), dim=-1))
    return probs, ok


def _kept_by_full_sort(x, k, p) -> torch.Tensor:
    sorted_x, order = x.sort(dim=-1, descending=True)
    v = x.shape[-1]
    drop = torch.arange(v, device=x.device) >= k.unsqueeze(-1)
    drop |= _top_p_drop(torch.softmax(sorted_x.masked_fill(drop, float("-inf")), dim=-1), p)
    sorted_x = sorted_x.masked_fill(drop, float("-inf"))
    return torch.softmax(torch.empty_like(x).scatter_(-1, order, sorted_x), dim=-1)


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from a 1-D distribution using a float64 uniform (inverse CDF)."""
    u = torch.rand((), generator=generator, dtype=torch.float64, device=probs.device)
    cdf = probs.double().cumsum(0)
    idx = int(torch.searchsorted(cdf, u * cdf[-1], right=True).item())
    return min(idx, probs.shape[0] - 1)


def sample_rows(logits: torch.Tensor, params: list[SamplingParams],
                generators: list[torch.Generator | None], argmax: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of `logits` [R, vocab], per row's params: the argmax when
    greedy, else `logits_to_probs` (the transform the verifier applies to the same
    logits) and one float64 uniform from the row's own generator, so a row's draw
    does not depend on the other rows of the batch. The one sampler of the engine's
    drafters and of the plain reference loop. Returns [R] int64.
    `argmax` [R]: the rows' argmax from a faster kernel than torch's (the runtime's),
    passed in so that sampling, like verification, imports no runtime."""
    out = logits.argmax(dim=-1) if argmax is None else argmax.clone()
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
