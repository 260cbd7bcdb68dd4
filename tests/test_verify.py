"""The rejection sampler: exact greedy cases, seeded determinism and edge cases (its
statistical losslessness: test_verify_lossless.py)."""

from __future__ import annotations

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


def test_argmax_passed_in_is_the_one_used() -> None:
    """The engine passes the runtime kernel's argmax; verification, which imports no
    kernel, must decide by it (and check its shape), on the greedy path and the mixed one."""
    logits = peaked_logits([3, 5, 7])
    given = tokens(3, 4, 9)  # disagrees with the logits at rows 1 and 2
    res = rejection_sample(logits, tokens(3, 4), None, [0, 2], [GREEDY], [None], target_argmax=given)
    assert res.output_tokens == [[3, 4, 9]]
    mixed = rejection_sample(torch.cat([logits, peaked_logits([1])]), tokens(3, 4), None, [0, 2, 2],
                             [GREEDY, SamplingParams(temperature=1.0)],
                             [None, torch.Generator().manual_seed(0)], target_argmax=torch.cat([given, tokens(1)]))
    assert mixed.output_tokens[0] == [3, 4, 9]
    with pytest.raises(ValueError, match="target_argmax"):
        rejection_sample(logits, tokens(3, 4), None, [0, 2], [GREEDY], [None], target_argmax=tokens(3))


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
