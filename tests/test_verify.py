"""The rejection sampler: exact greedy cases, seeded determinism, edge cases, and
statistical losslessness of a toy speculative loop against the exact target."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from dspark.sampling import SamplingParams, logits_to_probs, sample_from_probs
from dspark.verify import VerifyResult, rejection_sample

V = 10  # toy vocabulary
GREEDY = SamplingParams(temperature=0.0)


def peaked_logits(tokens: list[int], vocab: int = V) -> torch.Tensor:
    """[len(tokens), vocab] logits whose argmax in row j is tokens[j]."""
    g = torch.Generator().manual_seed(sum(tokens) + len(tokens))
    logits = torch.randn(len(tokens), vocab, generator=g)
    logits[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)] = 10.0
    return logits


def tokens(*ids: int) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.long)


# ---------------------------------------------------------------- exact greedy cases


def greedy_one(target_argmax: list[int], drafts: list[int]) -> VerifyResult:
    return rejection_sample(
        peaked_logits(target_argmax), tokens(*drafts), None, [0, len(drafts)], [GREEDY], [None]
    )


def test_greedy_perfect_match_accepts_all_and_adds_bonus() -> None:
    res = greedy_one([3, 5, 7, 2], [3, 5, 7])
    assert res.num_accepted == [3]
    assert res.output_tokens == [[3, 5, 7, 2]]


def test_greedy_early_mismatch_emits_target_argmax() -> None:
    res = greedy_one([3, 5, 7, 2], [3, 4, 7])
    assert res.num_accepted == [1]
    assert res.output_tokens == [[3, 5]]  # the matching 7 after a mismatch is not accepted


def test_greedy_all_rejected() -> None:
    res = greedy_one([3, 5, 7, 2], [1, 5, 7])
    assert res.num_accepted == [0]
    assert res.output_tokens == [[3]]


def test_greedy_zero_length_draft_emits_bonus_only() -> None:
    res = rejection_sample(peaked_logits([6]), tokens(), None, [0, 0], [GREEDY], [None])
    assert res.num_accepted == [0]
    assert res.output_tokens == [[6]]


def test_greedy_mixed_lengths_in_one_batch_ignore_draft_logits() -> None:
    # (target argmax per row, drafts): L = 0, 3, 1, 0, 2, 3
    cases = [
        ([4], []),
        ([1, 2, 3, 9], [1, 2, 3]),
        ([8, 0], [7]),
        ([5], []),
        ([2, 2, 6], [2, 2]),
        ([0, 1, 2, 3], [0, 9, 2]),
    ]
    expected = [(0, [4]), (3, [1, 2, 3, 9]), (0, [8]), (0, [5]), (2, [2, 2, 6]), (1, [0, 1])]
    target = torch.cat([peaked_logits(t) for t, _ in cases])
    drafts = torch.tensor([d for _, ds in cases for d in ds], dtype=torch.long)
    cu = [0]
    for _, ds in cases:
        cu.append(cu[-1] + len(ds))
    draft_logits = torch.randn(drafts.numel(), V, generator=torch.Generator().manual_seed(0))
    for dl in (None, draft_logits):
        res = rejection_sample(target, drafts, dl, cu, [GREEDY] * len(cases), [None] * len(cases))
        assert res.num_accepted == [a for a, _ in expected]
        assert res.output_tokens == [out for _, out in expected]


def test_empty_batch() -> None:
    res = rejection_sample(torch.zeros(0, V), tokens(), None, [0], [], [])
    assert res == VerifyResult(num_accepted=[], output_tokens=[])


def test_bad_layout_is_reported() -> None:
    with pytest.raises(ValueError, match="target_logits"):
        rejection_sample(torch.zeros(4, V), tokens(1, 2), None, [0, 2], [GREEDY], [None])
    with pytest.raises(ValueError, match="generators"):
        rejection_sample(torch.zeros(3, V), tokens(1, 2), None, [0, 2], [GREEDY], [])
    with pytest.raises(ValueError, match="draft_logits"):
        rejection_sample(torch.zeros(3, V), tokens(1, 2), torch.zeros(2, V + 1), [0, 2], [GREEDY], [None])
    with pytest.raises(ValueError, match="int64"):
        rejection_sample(torch.zeros(3, V), tokens(1, 2).int(), None, [0, 2], [GREEDY], [None])


# ---------------------------------------------------------------- seeded determinism


@dataclass
class ToyRequest:
    target_logits: torch.Tensor  # [L + 1, V]
    draft_tokens: torch.Tensor  # [L]
    draft_logits: torch.Tensor  # [L, V]
    params: SamplingParams
    seed: int


def random_requests(n: int, seed: int) -> list[ToyRequest]:
    g = torch.Generator().manual_seed(seed)
    kinds = [
        GREEDY,
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=3),
        SamplingParams(temperature=1.3, top_p=0.7),
    ]
    reqs = []
    for i in range(n):
        length = int(torch.randint(0, 5, (), generator=g))
        reqs.append(
            ToyRequest(
                target_logits=torch.randn(length + 1, V, generator=g) * 2,
                draft_tokens=torch.randint(0, V, (length,), generator=g),
                draft_logits=torch.randn(length, V, generator=g) * 2,
                params=kinds[i % len(kinds)],
                seed=1000 + i,
            )
        )
    return reqs


def run_batch(reqs: list[ToyRequest], with_draft_logits: bool = True) -> list[list[int]]:
    cu = [0]
    for r in reqs:
        cu.append(cu[-1] + r.draft_tokens.numel())
    res = rejection_sample(
        torch.cat([r.target_logits for r in reqs]),
        torch.cat([r.draft_tokens for r in reqs]),
        torch.cat([r.draft_logits for r in reqs]) if with_draft_logits else None,
        cu,
        [r.params for r in reqs],
        [torch.Generator().manual_seed(r.seed) for r in reqs],
    )
    assert all(len(out) == a + 1 for out, a in zip(res.output_tokens, res.num_accepted))
    return res.output_tokens


@pytest.mark.parametrize("with_draft_logits", [True, False])
def test_same_seeds_same_outputs(with_draft_logits: bool) -> None:
    reqs = random_requests(40, seed=1)
    first = run_batch(reqs, with_draft_logits)
    assert run_batch(reqs, with_draft_logits) == first
    reseeded = [ToyRequest(r.target_logits, r.draft_tokens, r.draft_logits, r.params, r.seed + 7) for r in reqs]
    assert run_batch(reseeded, with_draft_logits) != first  # the seeds do matter


@pytest.mark.parametrize("with_draft_logits", [True, False])
def test_request_output_independent_of_batch(with_draft_logits: bool) -> None:
    reqs = random_requests(24, seed=2)
    full = run_batch(reqs, with_draft_logits)
    alone = [run_batch([r], with_draft_logits)[0] for r in reqs]
    assert full == alone
    order = torch.randperm(len(reqs), generator=torch.Generator().manual_seed(3)).tolist()
    shuffled = run_batch([reqs[i] for i in order], with_draft_logits)
    assert [shuffled[order.index(i)] for i in range(len(reqs))] == full
    subset = [0, 5, 6, 11, 19]
    assert run_batch([reqs[i] for i in subset], with_draft_logits) == [full[i] for i in subset]


def greedy_reference(r: ToyRequest) -> list[int]:
    argmax = r.target_logits.argmax(dim=-1).tolist()
    out = []
    for draft, best in zip(r.draft_tokens.tolist(), argmax):
        if draft != best:
            break
        out.append(draft)
    return out + [argmax[len(out)]]


def test_mixed_greedy_and_sampling_batch() -> None:
    reqs = random_requests(32, seed=6)
    outputs = run_batch(reqs)
    for r, out in zip(reqs, outputs):
        if r.params.greedy:
            assert out == greedy_reference(r)
    assert any(not r.params.greedy and len(out) > 1 for r, out in zip(reqs, outputs))  # some drafts accepted


def test_random_number_use_is_fixed() -> None:
    """A sampling request draws exactly L + 1 float64 uniforms; greedy draws none."""
    reqs = random_requests(8, seed=4)
    gens = [torch.Generator().manual_seed(r.seed) for r in reqs]
    cu = [0]
    for r in reqs:
        cu.append(cu[-1] + r.draft_tokens.numel())
    rejection_sample(
        torch.cat([r.target_logits for r in reqs]),
        torch.cat([r.draft_tokens for r in reqs]),
        torch.cat([r.draft_logits for r in reqs]),
        cu,
        [r.params for r in reqs],
        gens,
    )
    for r, gen in zip(reqs, gens):
        expected = torch.Generator().manual_seed(r.seed)
        if not r.params.greedy:
            torch.rand(r.draft_tokens.numel() + 1, generator=expected, dtype=torch.float64)
        assert torch.equal(gen.get_state(), expected.get_state())


def test_zero_length_sampling_matches_plain_sampling() -> None:
    """With nothing drafted, verification is plain sampling from the target."""
    logits = torch.randn(50, V, generator=torch.Generator().manual_seed(5)) * 2
    params = SamplingParams(temperature=0.9, top_k=6, top_p=0.9)
    for i in range(50):
        res = rejection_sample(logits[i : i + 1], tokens(), None, [0, 0], [params], [torch.Generator().manual_seed(i)])
        probs = logits_to_probs(logits[i], params.temperature, params.top_k, params.top_p)
        assert res.output_tokens == [[sample_from_probs(probs, torch.Generator().manual_seed(i))]]


# ---------------------------------------------------------------- numerical edge cases


def test_deterministic_draft_outside_top_k_is_always_rejected() -> None:
    target = torch.arange(V, dtype=torch.float32).repeat(2, 1)  # [2, V]: top-3 = {7, 8, 9}
    params = SamplingParams(temperature=1.0, top_k=3)
    for seed in range(100):
        res = rejection_sample(target, tokens(0), None, [0, 1], [params], [torch.Generator().manual_seed(seed)])
        assert res.num_accepted == [0]
        assert res.output_tokens[0][0] in (7, 8, 9)


def test_draft_with_zero_draft_probability_is_accepted_when_target_allows_it() -> None:
    # Token 0 is outside the draft's top-2 (q = 0) but inside the target's (p > 0):
    # min(1, p/q) = 1.
    target = torch.tensor([[5.0, 4.0] + [0.0] * (V - 2)] * 2)  # [2, V]
    draft = torch.tensor([[0.0, 5.0, 4.0] + [0.0] * (V - 3)])  # [1, V]
    params = SamplingParams(temperature=1.0, top_k=2)
    for seed in range(50):
        res = rejection_sample(target, tokens(0), draft, [0, 1], [params], [torch.Generator().manual_seed(seed)])
        assert res.num_accepted == [1]


def test_rejection_with_no_residual_mass_falls_back_to_target() -> None:
    # p(0) = 0 exactly, q(0) is a float32 denormal and every other q equals p in
    # float32: drafting 0 is always rejected and max(0, p - q) is all zeros.
    target = torch.zeros(2, V)
    target[:, 0] = float("-inf")
    draft = torch.zeros(1, V)
    draft[0, 0] = -100.0
    params = SamplingParams(temperature=1.0)
    p = logits_to_probs(target[0], 1.0)
    q = logits_to_probs(draft[0], 1.0)
    assert float((p - q).clamp_min(0).sum()) < 1e-6
    seen = set()
    for seed in range(100):
        res = rejection_sample(target, tokens(0), draft, [0, 1], [params], [torch.Generator().manual_seed(seed)])
        assert res.num_accepted == [0]
        seen.add(res.output_tokens[0][0])
    assert seen == set(range(1, V))  # drawn from p: every allowed token, never 0


# ---------------------------------------------------------------- statistical losslessness
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


def test_all_greedy_batches_accept_the_prefix_that_matches_the_argmax() -> None:
    """A batch of greedy requests only (plain decoding, greedy speculation) takes its own
    path: each request keeps the drafts up to the first that differs from the target's
    argmax at its row, then the argmax after them; checked against that rule written out."""
    g = torch.Generator().manual_seed(11)
    vocab = 50
    for trial in range(40):
        lengths = torch.randint(0, 6, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g).tolist()
        logits = torch.randn(sum(lengths) + len(lengths), vocab, generator=g)
        best = logits.argmax(-1).tolist()
        drafts, cu = [], [0]
        for i, n in enumerate(lengths):
            row = cu[-1] + i
            keep = int(torch.randint(0, n + 1, (1,), generator=g))  # drafts that agree, then one that may not
            drafts += [best[row + j] if j < keep else int(torch.randint(0, vocab, (1,), generator=g)) for j in range(n)]
            cu.append(cu[-1] + n)
        out = rejection_sample(logits, torch.tensor(drafts, dtype=torch.long), None, cu,
                               [SamplingParams()] * len(lengths), [None] * len(lengths))
        for i, n in enumerate(lengths):
            row, mine = cu[i] + i, drafts[cu[i]:cu[i + 1]]
            a = next((j for j in range(n) if mine[j] != best[row + j]), n)
            assert out.num_accepted[i] == a and out.output_tokens[i] == mine[:a] + [best[row + a]], (trial, i)
