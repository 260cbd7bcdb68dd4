"""Lossless verification of drafted tokens: the rejection sampler.

A pure function of target and draft logits; no model inside. Its output tokens are
distributed exactly as if every token had been sampled from the target alone (for
greedy requests: exactly the target's argmax chain), whatever the drafter proposed.

Glossary, for one request that drafted L tokens d_1..d_L in a round:

* **accepted tokens**: the longest prefix d_1..d_a of the draft that passes
  verification (0 <= a <= L). Greedy: d_j equals the target argmax. Sampling: d_j
  passes with probability min(1, p_j(d_j) / q_j(d_j)).
* **recovered token**: when d_{a+1} is rejected, the token emitted in its place,
  sampled from normalize(max(0, p_{a+1} - q_{a+1})) (greedy: the target argmax at
  that position). This correction is what makes the output follow p exactly.
* **bonus token**: when all L drafts are accepted, one more token sampled from the
  target distribution at the position after the last draft (greedy: its argmax),
  which the same target forward computed for free.

So every request emits a + 1 tokens per round: its accepted tokens followed by
exactly one recovered or bonus token.

Randomness: a sampling request draws exactly L + 1 float64 uniforms from its own
generator, in one call, before anything is decided: uniform j (j < L) decides
draft j, uniform L picks the recovered or bonus token by inverse CDF. The count and
order do not depend on the outcome or on the other requests in the batch, so a
seeded request gives the same tokens whatever it is batched with (provided no two
requests share a generator object). Greedy requests draw nothing.

Why float64 uniforms: a float32 uniform takes only 2^24 distinct values, 6e-8
apart. The acceptance test u < p/q would round every ratio to that grid, and an
inverse-CDF draw over a ~150k-token vocabulary could not resolve tokens whose
probability is below the spacing; in a peaked distribution that is most of the
vocabulary (the median token probability is often ~1e-7), so their mass would be
handed to their neighbours. float64 (2^53 values) shrinks both errors to ~1e-16.
Probabilities stay fp32 and are promoted to float64 for the comparison and the
cumulative sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.sampling import SamplingParams, logits_to_probs

# max(0, p - q) sums to the probability that the draft is rejected, so a rejection
# with a residual this small is (up to float32 noise in p and q, which each sum to 1
# only within ~1e-7) a case where p and q are equal; the residual is then noise and
# the target distribution p is the correct thing to sample from.
RESIDUAL_MASS_FLOOR = 1e-6


@dataclass
class VerifyResult:
    num_accepted: list[int]  # [R] accepted draft tokens per request
    output_tokens: list[list[int]]  # [R] accepted drafts followed by one recovered-or-bonus token


def rejection_sample(
    target_logits: torch.Tensor,  # [sum_i (L_i + 1), vocab] raw target logits
    draft_tokens: torch.Tensor,  # [sum_i L_i] int64
    draft_logits: torch.Tensor | None,  # [sum_i L_i, vocab] raw draft logits, or None
    cu_num_draft: list[int],  # [R + 1] offsets into draft rows
    params: list[SamplingParams],  # [R]
    generators: list[torch.Generator | None],  # [R]
    target_argmax: torch.Tensor | None = None,  # [sum_i (L_i + 1)] int64, the target rows' argmax
) -> VerifyResult:
    """Verify the drafts of R requests against one target forward.

    Request i drafted L_i = cu_num_draft[i+1] - cu_num_draft[i] tokens (L_i may be
    0); they are draft rows cu_num_draft[i] .. cu_num_draft[i+1]-1. It owns target
    rows cu_num_draft[i]+i .. cu_num_draft[i+1]+i: target row j of the request is the
    target's distribution for draft token j, and its last row (j = L_i) is the bonus
    position. Logits are raw; the request's temperature, top-k and top-p are
    applied here to target and draft alike. `draft_logits` None means deterministic
    proposals (e.g. n-gram lookup): q is one-hot on the drafted token. Requests with
    temperature 0 are verified greedily and ignore the draft logits.

    Edge cases: a drafted token with p(x) = 0 is always rejected; one with q(x) = 0
    (impossible for a draft sampled from q) is accepted whenever p(x) > 0, the limit
    of min(1, p/q); a rejection whose residual max(0, p - q) has (numerically) no
    mass samples from p instead. See the module docstring for the glossary and the
    use of random numbers.

    `target_argmax`: the argmax of `target_logits`' rows when the caller has a faster
    kernel for it than torch's (the engine passes the runtime's native one); this
    module stays a function of tensors, importing no model or kernel.
    """
    num_draft = _check_inputs(target_logits, draft_tokens, draft_logits, cu_num_draft, params, generators)
    if not params:
        return VerifyResult(num_accepted=[], output_tokens=[])
    if all(p.greedy for p in params):
        return _greedy(_argmax(target_logits, target_argmax), draft_tokens, cu_num_draft)
    device = target_logits.device
    num_req = len(params)
    draft_len = torch.tensor(num_draft, dtype=torch.long, device=device)  # [R]
    cu = torch.tensor(cu_num_draft, dtype=torch.long, device=device)  # [R+1]
    req_ids = torch.arange(num_req, device=device)  # [R]
    draft_req = torch.repeat_interleave(req_ids, draft_len)  # [D] request of each draft row
    judge_row = torch.arange(draft_tokens.shape[0], device=device) + draft_req  # [D] target row judging each draft
    is_sampling = torch.tensor([not p.greedy for p in params], device=device)  # [R]
    uniforms = _draw_uniforms(num_draft, params, generators, device)  # [T] float64, aligned with target rows

    target_argmax = _argmax(target_logits, target_argmax)  # [T]
    accepted = draft_tokens == target_argmax[judge_row]  # [D] the greedy rule
    probs = None
    if bool(is_sampling.any()):
        probs = _SampledProbs.build(target_logits, draft_logits, params, draft_len, is_sampling)
        d_rows = torch.nonzero(is_sampling[draft_req]).squeeze(-1)  # [D_s]
        tokens = draft_tokens[d_rows]  # [D_s]
        p_x = probs.target_prob_of(judge_row[d_rows], tokens)  # [D_s] float64
        q_x = probs.draft_prob_of(d_rows, tokens)  # [D_s] float64
        # u < p/q without the division: min(1, .) is implicit because u < 1, q = 0
        # accepts exactly when p > 0, and p = 0 never accepts.
        accepted[d_rows] = uniforms[judge_row[d_rows]] * q_x < p_x

    num_accepted = _accepted_prefix_len(accepted, cu, draft_len)  # [R]
    final_row = cu[:-1] + req_ids + num_accepted  # [R] target row of the recovered or bonus token
    final_tokens = target_argmax[final_row]  # [R] already right for greedy requests
    if probs is not None:
        s_reqs = torch.nonzero(is_sampling).squeeze(-1)  # [R_s]
        rejected = num_accepted[s_reqs] < draft_len[s_reqs]  # [R_s]
        rejected_draft_row = (cu[:-1] + num_accepted)[s_reqs]  # [R_s] meaningful where rejected
        dist = probs.final_distribution(final_row[s_reqs], rejected, rejected_draft_row, draft_tokens)  # [R_s, vocab]
        bonus_row = cu[1:] + req_ids  # [R] its uniform picks the final token
        final_tokens[s_reqs] = _inverse_cdf(dist, uniforms[bonus_row[s_reqs]])

    counts = num_accepted.tolist()
    drafts = draft_tokens.tolist()
    finals = final_tokens.tolist()
    outputs = [drafts[start : start + a] + [tok] for start, a, tok in zip(cu_num_draft, counts, finals)]
    return VerifyResult(num_accepted=counts, output_tokens=outputs)


def _argmax(target_logits: torch.Tensor, given: torch.Tensor | None) -> torch.Tensor:
    if given is None:
        return target_logits.argmax(dim=-1)  # [T]
    if given.shape != target_logits.shape[:-1]:
        raise ValueError(f"target_argmax has shape {tuple(given.shape)}; expected {tuple(target_logits.shape[:-1])}")
    return given


def _greedy(target_argmax: torch.Tensor, draft_tokens: torch.Tensor, cu_num_draft: list[int]) -> VerifyResult:
    """A batch of greedy requests only (plain decoding's every step): the longest prefix
    of each request's drafts that equals the target's argmax, then the argmax after it,
    in plain Python over the few tokens there are (the general path's tensor
    bookkeeping cost a one-token decode step 0.4 ms)."""
    best = target_argmax.tolist()
    drafts = draft_tokens.tolist()
    counts, outputs = [], []
    for i, (start, end) in enumerate(zip(cu_num_draft, cu_num_draft[1:])):
        row = start + i  # the request's first target row
        a = 0
        while start + a < end and drafts[start + a] == best[row + a]:
            a += 1
        counts.append(a)
        outputs.append(drafts[start : start + a] + [best[row + a]])
    return VerifyResult(num_accepted=counts, output_tokens=outputs)


@dataclass
class _SampledProbs:
    """Transformed target and draft probabilities of the sampling requests' rows
    only (greedy rows are never transformed), with maps from a global row to its
    row here (-1 for greedy rows)."""

    target: torch.Tensor  # [T_s, vocab] fp32
    draft: torch.Tensor | None  # [D_s, vocab] fp32; None: one-hot on the drafted token
    target_local: torch.Tensor  # [T] int64
    draft_local: torch.Tensor  # [D] int64

    @classmethod
    def build(
        cls,
        target_logits: torch.Tensor,  # [T, vocab]
        draft_logits: torch.Tensor | None,  # [D, vocab]
        params: list[SamplingParams],  # [R]
        draft_len: torch.Tensor,  # [R]
        is_sampling: torch.Tensor,  # [R] bool
    ) -> _SampledProbs:
        device = target_logits.device
        req_ids = torch.arange(len(params), device=device)  # [R]
        target_req = torch.repeat_interleave(req_ids, draft_len + 1)  # [T]
        draft_req = torch.repeat_interleave(req_ids, draft_len)  # [D]
        t_rows = torch.nonzero(is_sampling[target_req]).squeeze(-1)  # [T_s]
        d_rows = torch.nonzero(is_sampling[draft_req]).squeeze(-1)  # [D_s]
        target_local = torch.full_like(target_req, -1)  # [T]
        target_local[t_rows] = torch.arange(t_rows.numel(), device=device)
        draft_local = torch.full_like(draft_req, -1)  # [D]
        draft_local[d_rows] = torch.arange(d_rows.numel(), device=device)

        temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)  # [R]
        top_k = torch.tensor([p.top_k for p in params], dtype=torch.long, device=device)  # [R]
        top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)  # [R]

        def transform(logits: torch.Tensor, row_req: torch.Tensor) -> torch.Tensor:  # [N, vocab], [N]
            return logits_to_probs(logits, temperature[row_req], top_k[row_req], top_p[row_req])

        if bool(is_sampling.all()):  # the common case: skip copying every row
            target = transform(target_logits, target_req)
            draft = None if draft_logits is None else transform(draft_logits, draft_req)
        else:
            target = transform(target_logits[t_rows], target_req[t_rows])
            draft = None if draft_logits is None else transform(draft_logits[d_rows], draft_req[d_rows])
        return cls(target, draft, target_local, draft_local)

    def target_prob_of(self, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """[N] float64 p(token) at global target rows [N]."""
        return self.target[self.target_local[rows], tokens].double()

    def draft_prob_of(self, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """[N] float64 q(token) at global draft rows [N]."""
        if self.draft is None:
            return torch.ones(rows.shape[0], dtype=torch.float64, device=rows.device)
        return self.draft[self.draft_local[rows], tokens].double()

    def final_distribution(
        self,
        final_rows: torch.Tensor,  # [N] global target row of the final token
        rejected: torch.Tensor,  # [N] bool: a draft was rejected (else: bonus)
        rejected_draft_rows: torch.Tensor,  # [N] global draft row of the rejected draft (ignored for bonus)
        draft_tokens: torch.Tensor,  # [D]
    ) -> torch.Tensor:
        """[N, vocab] float64, unnormalised: max(0, p - q) after a rejection, p for a
        bonus token or when the residual has (numerically) no mass."""
        dist = self.target[self.target_local[final_rows]].double()  # [N, vocab]
        if not bool(rejected.any()):
            return dist
        rej = torch.nonzero(rejected).squeeze(-1)  # [N_rej]
        rows = rejected_draft_rows[rej]  # [N_rej]
        if self.draft is None:
            q = torch.nn.functional.one_hot(draft_tokens[rows], dist.shape[-1]).double()  # [N_rej, vocab]
        else:
            q = self.draft[self.draft_local[rows]].double()  # [N_rej, vocab]
        p = dist[rej]  # [N_rej, vocab]
        residual = (p - q).clamp_min(0.0)  # [N_rej, vocab]
        has_mass = residual.sum(dim=-1, keepdim=True) > RESIDUAL_MASS_FLOOR  # [N_rej, 1]
        dist[rej] = torch.where(has_mass, residual, p)
        return dist


def _check_inputs(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_logits: torch.Tensor | None,
    cu_num_draft: list[int],
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[int]:
    """Validate the batch layout; returns L_i per request."""
    num_req = len(params)
    if len(generators) != num_req:
        raise ValueError(f"got {num_req} sampling params but {len(generators)} generators; pass one per request")
    if len(cu_num_draft) != num_req + 1 or cu_num_draft[0] != 0:
        raise ValueError(f"cu_num_draft must have R + 1 = {num_req + 1} offsets starting at 0, got {cu_num_draft}")
    num_draft = [b - a for a, b in zip(cu_num_draft, cu_num_draft[1:])]
    if any(n < 0 for n in num_draft):
        raise ValueError(f"cu_num_draft must be non-decreasing, got {cu_num_draft}")
    if draft_tokens.dim() != 1 or draft_tokens.dtype != torch.long:
        raise ValueError(
            f"draft_tokens must be a 1-D int64 tensor, got {draft_tokens.dtype} of shape {tuple(draft_tokens.shape)}"
        )
    if draft_tokens.shape[0] != cu_num_draft[-1]:
        raise ValueError(f"cu_num_draft covers {cu_num_draft[-1]} drafts but draft_tokens has {draft_tokens.shape[0]}")
    if target_logits.dim() != 2 or target_logits.shape[0] != cu_num_draft[-1] + num_req:
        raise ValueError(
            f"target_logits must be [sum_i (L_i + 1), vocab] = [{cu_num_draft[-1] + num_req}, vocab], "
            f"got {tuple(target_logits.shape)}"
        )
    if draft_logits is not None and tuple(draft_logits.shape) != (draft_tokens.shape[0], target_logits.shape[1]):
        raise ValueError(
            f"draft_logits must be [sum_i L_i, vocab] = [{draft_tokens.shape[0]}, {target_logits.shape[1]}], "
            f"got {tuple(draft_logits.shape)}"
        )
    return num_draft


def _draw_uniforms(
    num_draft: list[int],
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    device: torch.device,
) -> torch.Tensor:
    """[sum_i (L_i + 1)] float64, laid out like the target rows: L_i acceptance
    uniforms then the one for the final token. Zeros for greedy requests."""
    chunks = []
    for n, p, gen in zip(num_draft, params, generators):
        if p.greedy:
            chunks.append(torch.zeros(n + 1, dtype=torch.float64, device=device))
        else:
            # Drawn where the generator lives (a CPU generator may serve a GPU batch).
            where = gen.device if gen is not None else device
            chunks.append(torch.rand(n + 1, generator=gen, dtype=torch.float64, device=where).to(device))
    return torch.cat(chunks)


def _accepted_prefix_len(
    accepted: torch.Tensor,  # [D] bool, per draft token
    cu: torch.Tensor,  # [R+1]
    draft_len: torch.Tensor,  # [R]
) -> torch.Tensor:
    """[R] length of each request's run of accepted drafts from the start."""
    max_len = int(draft_len.max()) if draft_len.numel() else 0
    if max_len == 0:
        return torch.zeros_like(draft_len)
    pos = torch.arange(max_len, device=cu.device)  # [L_max]
    in_draft = pos < draft_len.unsqueeze(1)  # [R, L_max]
    rows = (cu[:-1].unsqueeze(1) + pos).clamp(max=accepted.shape[0] - 1)  # [R, L_max]
    padded = accepted[rows] & in_draft  # [R, L_max]
    return padded.long().cumprod(dim=1).sum(dim=1)


def _inverse_cdf(
    dist: torch.Tensor,  # [N, vocab] float64, unnormalised, non-negative
    u: torch.Tensor,  # [N] float64 in [0, 1)
) -> torch.Tensor:
    """[N] one token per row. Same rule as `sampling.sample_from_probs`, so a
    request with nothing drafted samples exactly as plain decoding would."""
    cdf = dist.cumsum(dim=-1)  # [N, vocab]
    point = (u * cdf[:, -1]).unsqueeze(1)  # [N, 1]
    idx = torch.searchsorted(cdf, point, right=True).squeeze(1)  # [N]
    # u * total can round up to total; never land on a zero-probability tail token.
    vocab_ids = torch.arange(dist.shape[-1], device=dist.device)  # [vocab]
    last_nonzero = torch.where(dist > 0, vocab_ids, torch.zeros_like(vocab_ids)).amax(dim=-1)  # [N]
    return torch.minimum(idx, last_nonzero)
