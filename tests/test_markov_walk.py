"""The precomputed walk of a vanilla Markov head over restricted candidates
(dspark/drafters/markov_walk.py) against a plain reference: one request at a time,
position by position, the bias computed from the token actually drawn before."""

import random

import pytest
import torch

from dspark.drafters.base import DraftRequest
from dspark.drafters.markov_walk import walk_vanilla
from dspark.sampling import SamplingParams, sample_rows

VOCAB, RANK, C = 300, 8, 12


def reference(base_cand, cand_target, w2c, w1, anchor, params, gen, look=None, m=0):
    """One request: (tokens [N], logits [N, C]); positions < m take the lookup token
    (a draw is still made there, as the draft does)."""
    prev, tokens, rows = anchor, [], []
    for k in range(base_cand.shape[0]):
        row = base_cand[k] + (w2c[k] @ w1[prev]).float()
        j = int(sample_rows(row[None], [params], [gen])[0])
        tok = int(look[k]) if k < m else int(cand_target[k, j])
        tokens.append(tok)
        rows.append(row)
        prev = tok
    return tokens, torch.stack(rows)


@pytest.mark.parametrize("N", [1, 5])
@pytest.mark.parametrize("with_lookup", [False, True])
def test_walk_matches_the_position_by_position_reference(with_lookup, N):
    rng = random.Random(7)
    torch.manual_seed(7)
    w1 = torch.randn(VOCAB, RANK)
    for trial in range(20):
        r = rng.randint(1, 4)
        base_cand = torch.randn(r, N, C)
        cand_target = torch.stack([torch.stack([torch.randperm(VOCAB)[:C] for _ in range(N)]) for _ in range(r)])
        w2c = torch.randn(r, N, C, RANK)
        anchors = torch.randint(0, VOCAB, (r,))
        params = [SamplingParams(temperature=0.0) if (trial + i) % 3 else SamplingParams(temperature=0.9, top_k=6)
                  for i in range(r)]
        look, used, starts = None, None, [0] * r
        if with_lookup:
            starts = [rng.randint(0, N) for _ in range(r)]
            look = torch.randint(0, VOCAB, (r, N))
            used = torch.arange(N)[None] < torch.tensor(starts)[:, None]
        gens = [torch.Generator().manual_seed(100 * trial + i) for i in range(r)]
        reqs = [DraftRequest(i, int(anchors[i]), 0, params[i], gens[i]) for i in range(r)]
        tokens, logits = walk_vanilla(base_cand, cand_target, w2c, w1, anchors, reqs, look, used)
        for i in range(r):
            gens[i].manual_seed(100 * trial + i)
            want_tok, want_rows = reference(base_cand[i], cand_target[i], w2c[i], w1, int(anchors[i]), params[i],
                                            gens[i], None if look is None else look[i], starts[i])
            assert tokens[i].tolist() == want_tok
            # the rows the drafter tokens were chosen from (lookup positions are replaced later)
            k0 = starts[i]
            torch.testing.assert_close(logits[i, k0:], want_rows[k0:], atol=1e-5, rtol=1e-5)
            if params[i].greedy and k0 < N:  # a greedy token is its row's argmax
                assert torch.equal(cand_target[i, k0:].gather(1, logits[i, k0:].argmax(-1, keepdim=True)).squeeze(1),
                                   tokens[i, k0:])
