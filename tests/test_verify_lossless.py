"""Statistical losslessness of the rejection sampler: a toy speculative loop (Markov-biased
and deterministic drafts, every temperature / top-k / top-p transform) against the exact
target distribution, and proof that the statistic catches wrong samplers."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from dspark.sampling import SamplingParams, logits_to_probs
from dspark.verify import VerifyResult, rejection_sample

V = 10  # toy vocabulary

#
# A toy language model over V tokens: the target is p(next | previous) (a random
# table), the draft a different q(next | previous), sampled left to right so each
# drafted token depends on the one drafted before it (a Markov-biased draft). A toy
# speculative loop (draft L tokens, verify, emit, repeat) generates the first two
# tokens after START; their empirical joint distribution must match the exact
# p(a | START) p(b | a) after the same temperature/top-k/top-p transform.

START = 0
TRANSFORMS = {
    "temperature": SamplingParams(temperature=0.8),
    "top_k": SamplingParams(temperature=1.0, top_k=4),
    "top_p": SamplingParams(temperature=1.2, top_p=0.8),
}
Sampler = Callable[..., VerifyResult]


def toy_tables(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Target logits [V, V], draft logits [V, V] (row = previous token) and a
    deterministic n-gram-like proposal [V] (next token for each previous one)."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(V, V, generator=g) * 1.5
    draft = 0.5 * target + torch.randn(V, V, generator=g) * 1.5
    lookup = torch.randint(0, V, (V,), generator=g)
    return target, draft, lookup


def table_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    return logits_to_probs(logits, params.temperature, params.top_k, params.top_p).double()  # [V, V]


def exact_pair_distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[V, V] P(first = a, second = b) when sampling from the table alone."""
    probs = table_probs(logits, params)
    return probs[START].unsqueeze(1) * probs


def speculative_pair_counts(
    sampler: Sampler,
    params: SamplingParams,
    draft_len: int,
    num_samples: int,
    seed: int,
    deterministic_draft: bool = False,
    verify_without_draft_logits: bool = False,
) -> torch.Tensor:
    """[V, V] counts of the first two tokens after START over `num_samples` runs
    of the toy speculative loop; every run is one request of each verify batch."""
    target_tab, draft_tab, lookup = toy_tables()
    q_tab = table_probs(draft_tab, params).float()  # [V, V]
    gen = torch.Generator().manual_seed(seed)
    emitted: list[list[int]] = [[] for _ in range(num_samples)]
    anchor = torch.full((num_samples,), START, dtype=torch.long)  # [N]
    active = list(range(num_samples))
    while active:
        m = len(active)
        prev = anchor[active]  # [m]
        context = [prev]
        for _ in range(draft_len):
            if deterministic_draft:
                prev = lookup[prev]
            else:
                prev = torch.multinomial(q_tab[prev], 1, generator=gen).squeeze(1)
            context.append(prev)
        ctx = torch.stack(context, dim=1)  # [m, L + 1]: anchor, then the drafts
        draft_logits = draft_tab[ctx[:, :-1]].reshape(-1, V)  # [m * L, V]
        res = sampler(
            target_tab[ctx].reshape(-1, V),  # [m * (L + 1), V]
            ctx[:, 1:].reshape(-1),  # [m * L]
            None if deterministic_draft or verify_without_draft_logits else draft_logits,
            list(range(0, m * draft_len + 1, draft_len)),
            [params] * m,
            [gen] * m,
        )
        still_active = []
        for req, out in zip(active, res.output_tokens):
            emitted[req].extend(out[: 2 - len(emitted[req])])
            if len(emitted[req]) < 2:
                anchor[req] = out[-1]
                still_active.append(req)
        active = still_active
    pairs = torch.tensor(emitted)  # [N, 2]
    return torch.bincount(pairs[:, 0] * V + pairs[:, 1], minlength=V * V).reshape(V, V)


def chi_square_z(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's chi-square of counts against a distribution, as a standard normal
    z-score (Wilson-Hilferty). Cells expecting fewer than 5 counts are pooled;
    any count in an impossible cell gives +inf."""
    obs = counts.flatten().double()
    exp = expected.flatten() * obs.sum()
    if float(obs[exp == 0].sum()) > 0:
        return math.inf
    big = exp >= 5
    small = (exp > 0) & ~big
    stat = float(((obs[big] - exp[big]) ** 2 / exp[big]).sum())
    cells = int(big.sum())
    if bool(small.any()):
        o, e = float(obs[small].sum()), float(exp[small].sum())
        stat += (o - e) ** 2 / e
        cells += 1
    dof = cells - 1
    scale = 2.0 / (9.0 * dof)
    return ((stat / dof) ** (1.0 / 3.0) - (1.0 - scale)) / math.sqrt(scale)


def total_variation(counts: torch.Tensor, expected: torch.Tensor) -> float:
    return 0.5 * float((counts.double() / counts.sum() - expected).abs().sum())


# With a correct sampler z is close to standard normal (over 36 seeded runs of
# these configurations: mean 0.2, sd 1.25, max 2.7), so 4.5 leaves a wide margin;
# the seeds are fixed, so the tests are deterministic. The wrong samplers below
# score about 17 and 41 at this sample count, far past 10 (p < 1e-23).
Z_PASS = 4.5
Z_CAUGHT = 10.0
N_SAMPLES = 10_000


@pytest.mark.parametrize("draft_len", [1, 2, 3])
@pytest.mark.parametrize("transform", list(TRANSFORMS))
def test_markov_draft_is_lossless(transform: str, draft_len: int) -> None:
    params = TRANSFORMS[transform]
    counts = speculative_pair_counts(rejection_sample, params, draft_len, N_SAMPLES, seed=draft_len)
    exact = exact_pair_distribution(toy_tables()[0], params)
    assert chi_square_z(counts, exact) < Z_PASS
    assert total_variation(counts, exact) < 0.05


@pytest.mark.parametrize("transform", list(TRANSFORMS))
def test_deterministic_draft_is_lossless(transform: str) -> None:
    params = TRANSFORMS[transform]
    counts = speculative_pair_counts(rejection_sample, params, 3, N_SAMPLES, seed=10, deterministic_draft=True)
    exact = exact_pair_distribution(toy_tables()[0], params)
    assert chi_square_z(counts, exact) < Z_PASS


def test_sampled_draft_verified_as_deterministic_is_still_lossless() -> None:
    """One-hot q is valid for any proposal, sampled or not (only less efficient)."""
    params = TRANSFORMS["top_p"]
    counts = speculative_pair_counts(
        rejection_sample, params, 2, N_SAMPLES, seed=20, verify_without_draft_logits=True
    )
    assert chi_square_z(counts, exact_pair_distribution(toy_tables()[0], params)) < Z_PASS


def test_output_converges_to_target_and_not_to_other_distributions() -> None:
    params = TRANSFORMS["temperature"]
    target_tab, draft_tab, _ = toy_tables()
    exact = exact_pair_distribution(target_tab, params)
    small = speculative_pair_counts(rejection_sample, params, 3, 1_000, seed=30)
    large = speculative_pair_counts(rejection_sample, params, 3, 100_000, seed=31)
    tv_small, tv_large = total_variation(small, exact), total_variation(large, exact)
    # Expected TV shrinks like 1/sqrt(N): about 0.09 at 1e3 and 0.009 at 1e5 here.
    assert tv_large < tv_small
    assert tv_large < 0.02
    assert chi_square_z(large, exact) < Z_PASS

    g = torch.Generator().manual_seed(32)
    references = [exact_pair_distribution(draft_tab, params)]  # what the draft alone would give
    references += [exact_pair_distribution(torch.randn(V, V, generator=g) * 1.5, params) for _ in range(5)]
    for ref in references:
        assert total_variation(large, ref) > 0.1
        assert total_variation(large, ref) > 10 * tv_large
        assert chi_square_z(large, ref) > Z_CAUGHT


# ---------------------------------------------------------------- the test can fail


def toy_verifier(bug: str | None) -> Sampler:
    """A compact sampler for the toy loop (every request: same L, same params,
    sampling), correct when `bug` is None, else wrong in one classic way:

    * "target_on_reject": after a rejection, sample from p instead of the residual;
    * "untransformed_draft": top-k/top-p applied to p but not to q.
    """

    def verify(
        target_logits: torch.Tensor,  # [m * (L + 1), V]
        draft_tokens: torch.Tensor,  # [m * L]
        draft_logits: torch.Tensor,  # [m * L, V]
        cu_num_draft: list[int],
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
    ) -> VerifyResult:
        m, sp, gen = len(params), params[0], generators[0]
        length = cu_num_draft[1]
        p = table_probs(target_logits, sp).view(m, length + 1, V)
        q_params = SamplingParams(temperature=sp.temperature) if bug == "untransformed_draft" else sp
        q = table_probs(draft_logits, q_params).view(m, length, V)
        x = draft_tokens.view(m, length)  # [m, L]
        p_x = p[:, :length].gather(2, x.unsqueeze(2)).squeeze(2)  # [m, L]
        q_x = q.gather(2, x.unsqueeze(2)).squeeze(2)  # [m, L]
        u = torch.rand(m, length, generator=gen, dtype=torch.float64)  # [m, L]
        accepted = (u * q_x < p_x).long().cumprod(dim=1).sum(dim=1)  # [m]
        rows = torch.arange(m)
        p_final = p[rows, accepted]  # [m, V]
        residual = (p_final - q[rows, accepted.clamp(max=length - 1)]).clamp_min(0)  # [m, V]
        if bug == "target_on_reject":
            residual = p_final
        dist = torch.where((accepted < length).unsqueeze(1), residual, p_final)  # [m, V]
        final = torch.multinomial(dist, 1, generator=gen).squeeze(1)  # [m]
        counts = accepted.tolist()
        outputs = [x[i, :a].tolist() + [int(final[i])] for i, a in enumerate(counts)]
        return VerifyResult(num_accepted=counts, output_tokens=outputs)

    return verify


@pytest.mark.parametrize(
    ("bug", "transform"),
    [(None, "top_k"), ("target_on_reject", "temperature"), ("untransformed_draft", "top_k")],
)
def test_statistic_catches_a_wrong_sampler(bug: str | None, transform: str) -> None:
    params = TRANSFORMS[transform]
    counts = speculative_pair_counts(toy_verifier(bug), params, 2, N_SAMPLES, seed=40)
    z = chi_square_z(counts, exact_pair_distribution(toy_tables()[0], params))
    if bug is None:
        assert z < Z_PASS  # the toy verifier itself is right, so a failure below is the bug's
    else:
        assert z > Z_CAUGHT
