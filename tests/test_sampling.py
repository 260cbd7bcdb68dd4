"""The logits -> probabilities transform against a plain per-row reference.

`logits_to_probs` finds a row's kept set among its largest logits when it can and
falls back to a full sort otherwise; both must keep exactly the tokens that
temperature, then top-k, then top-p keep, computed here one row at a time in float64
with Python's own sort, and a row's result must not depend on the rows beside it.
"""

from __future__ import annotations

import math

import pytest
import torch

from dspark import sampling
from dspark.sampling import FEW_CAP, logits_to_probs


def reference(row: torch.Tensor, temperature: float, top_k: int, top_p: float) -> dict[int, float]:
    """{token: probability} of one row, straight from the definition."""
    x = [float(v) / temperature for v in row.tolist()]
    order = sorted(range(len(x)), key=lambda i: -x[i])
    if 0 < top_k < len(x):
        order = order[:top_k]
    m = max(x[i] for i in order)
    z = sum(math.exp(x[i] - m) for i in order)
    kept, before = [], 0.0
    for i in order:
        if top_p < 1 and before >= top_p:
            break
        kept.append(i)
        before += math.exp(x[i] - m) / z
    z = sum(math.exp(x[i] - m) for i in kept)
    return {i: math.exp(x[i] - m) / z for i in kept}


def _rows(n: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scale = torch.linspace(0.3, 6.0, n).unsqueeze(-1)  # flat rows (top-p needs the full sort) to peaked ones
    return torch.randn(n, vocab, generator=g) * scale


CASES = [  # (temperature, top_k, top_p)
    (0.7, 20, 0.8), (1.0, 20, 1.0), (1.0, 0, 0.9), (0.5, 0, 0.5), (1.3, 0, 0.99),
    (1.0, FEW_CAP, 0.95), (1.0, FEW_CAP + 1, 0.9), (0.8, 1000, 1.0), (1.0, 1, 1.0), (1.0, 0, 1.0),
]


@pytest.mark.parametrize("temperature,top_k,top_p", CASES)
def test_kept_set_and_probabilities_match_the_definition(temperature, top_k, top_p):
    logits = _rows(6, 3000, seed=top_k + int(top_p * 100))
    probs = logits_to_probs(logits, temperature, top_k, top_p)
    assert probs.shape == logits.shape and probs.dtype == torch.float32
    for row, got in zip(logits, probs):
        want = reference(row, temperature, top_k, top_p)
        assert set(got.nonzero().squeeze(-1).tolist()) == set(want)
        assert float(got.sum()) == pytest.approx(1.0, abs=1e-5)
        ids = torch.tensor(sorted(want))
        assert torch.allclose(got[ids].double(), torch.tensor([want[i] for i in sorted(want)], dtype=torch.float64),
                              rtol=1e-4, atol=1e-7)


def test_both_paths_are_taken_and_a_row_does_not_depend_on_its_neighbours(monkeypatch):
    logits = _rows(len(CASES), 3000, seed=7)
    t = torch.tensor([c[0] for c in CASES])
    k = torch.tensor([c[1] for c in CASES])
    p = torch.tensor([c[2] for c in CASES])
    sorted_rows = []
    full_sort = sampling._kept_by_full_sort
    monkeypatch.setattr(sampling, "_kept_by_full_sort", lambda x, k, p: sorted_rows.append(len(x)) or full_sort(x, k, p))
    together = logits_to_probs(logits, t, k, p)
    # The sort is needed exactly for top-k above FEW_CAP and for top-p rows (without
    # top-k) that keep more than FEW_CAP tokens; here that is both kinds, not every row.
    need = [i for i, (temperature, top_k, top_p) in enumerate(CASES)
            if top_k > FEW_CAP or (top_k == 0 and top_p < 1 and len(reference(logits[i], temperature, 0, top_p)) > FEW_CAP)]
    assert sorted_rows == [len(need)] and 4 in need and 0 not in need
    for i, (temperature, top_k, top_p) in enumerate(CASES):
        alone = logits_to_probs(logits[i:i + 1], temperature, top_k, top_p)[0]
        assert torch.equal(alone, together[i]), CASES[i]
    # The flattest row with top-p 0.99 and no top-k keeps more than FEW_CAP tokens (the full
    # sort), the peaked top-k rows far fewer: the cases cover both ways of finding the set.
    kept = (together > 0).sum(-1)
    assert int(kept[4]) > FEW_CAP and int(kept[0]) <= 20


def test_shapes_and_per_row_parameters_broadcast():
    logits = _rows(6, 500, seed=3).reshape(2, 3, 500)
    t = torch.full((2, 3), 0.9)
    k = torch.tensor([[5, 0, 50], [0, 10, 0]])
    p = torch.tensor([[1.0, 0.7, 0.9], [1.0, 1.0, 0.6]])
    probs = logits_to_probs(logits, t, k, p)
    assert probs.shape == (2, 3, 500)
    for b in range(2):
        for r in range(3):
            want = reference(logits[b, r], 0.9, int(k[b, r]), float(p[b, r]))
            assert set(probs[b, r].nonzero().squeeze(-1).tolist()) == set(want)
