"""The native top-C selection a draft restricts its positions with (kernels/select_f32.c),
against torch.topk and against a plain sort by (value descending, index ascending)."""

from __future__ import annotations

import pytest
import torch

from dspark.runtime import cpu_kernels

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f"native kernel unavailable: {cpu_kernels.why_unavailable()}")


def reference(x: torch.Tensor, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's c best by (value descending, index ascending), in plain Python."""
    vals, idx = [], []
    for row in x.reshape(-1, x.shape[-1]).tolist():
        order = sorted(range(len(row)), key=lambda j: (-row[j], j))[:c]
        idx.append(order)
        vals.append([row[j] for j in order])
    shape = (*x.shape[:-1], c)
    return torch.tensor(vals, dtype=x.dtype).view(shape), torch.tensor(idx).view(shape)


@pytest.mark.parametrize("k,c", [(8192, 64), (8192, 1), (100, 100), (33, 7), (49152, 64), (4096, 1000), (9, 3)])
def test_topk_rows_matches_torch_on_random_rows(k, c):
    torch.manual_seed(k + c)
    x = torch.randn(3, 2, k) * 4
    vals, idx = cpu_kernels.topk_rows(x, c)
    ref_vals, ref_idx = x.topk(c, dim=-1)
    assert torch.equal(vals, ref_vals)
    assert torch.equal(idx, ref_idx)  # no ties among random floats: the same indices
    assert idx.dtype == torch.int64 and vals.shape == (3, 2, c)


def test_topk_rows_breaks_ties_by_index_and_survives_a_full_buffer():
    """Equal values rank by ascending index; ascending rows make every entry beat the
    threshold so far (the buffer fills and is cut many times); all -inf rows."""
    torch.manual_seed(0)
    x = torch.randint(0, 5, (4, 3000)).float()  # thousands of ties
    x[1] = torch.arange(3000.0)  # ascending: the buffer of 2048 overflows
    x[2] = float("-inf")
    x[3, :] = 1.0
    for c in (1, 64, 500):
        vals, idx = cpu_kernels.topk_rows(x, c)
        ref_vals, ref_idx = reference(x, c)
        assert torch.equal(vals, ref_vals)
        assert torch.equal(idx, ref_idx)


def test_topk_rows_leaves_nan_rows_and_other_inputs_to_torch():
    x = torch.randn(2, 300)
    x[1, 17] = float("nan")
    vals, idx = cpu_kernels.topk_rows(x, 5)
    ref_vals, ref_idx = x.topk(5, dim=-1)
    assert torch.equal(idx, ref_idx) and torch.equal(vals.isnan(), ref_vals.isnan())
    assert int(idx[1, 0]) == 17  # torch ranks NaN largest
    d = torch.randn(2, 300, dtype=torch.float64)
    assert torch.equal(cpu_kernels.topk_rows(d, 5)[1], d.topk(5, dim=-1)[1])  # other dtypes: torch
    with pytest.raises(RuntimeError):
        cpu_kernels.topk_rows(torch.randn(2, 4), 5)  # more than a row holds: torch's own error
