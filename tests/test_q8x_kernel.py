"""The q8x precision's kernel (kernels/gemm_q8x.c): the file's blocks with the
activations quantized to int8 per 32. Checked against an independent computation (the
`gguf` package's weights times activations quantized here in numpy, in float64), bit for
bit against its scalar reference, and a row's output against the same row computed with
any other rows or thread count beside it."""

import numpy as np
import pytest
import torch

from dspark.runtime import cpu_kernels
from dspark.runtime.quantized import BLOCKS, NOT_Q8X, QUANTIZED_TYPES, TYPES, QuantMatrix, gemm_quant
from test_quant_kernels import gguf_dequantize, isa, random_blocks  # noqa: F401 (isa: a fixture)

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="native kernels unavailable")

#: the types q8x packs (Q2_K is refused there: test_quant_kernels)
Q8X_TYPES = [t for t in QUANTIZED_TYPES if t not in NOT_Q8X]


def quantized_activations(x: torch.Tensor) -> np.ndarray:
    """x [M, K] -> the values q8x computes with: per block of 32, dx * round(x * 127 / max|x|)."""
    xb = x.numpy().astype(np.float32).reshape(x.shape[0], -1, 32)
    a = np.abs(xb).max(axis=2, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(a > 0, np.float32(127.0) / a, np.float32(0.0)).astype(np.float32)
    q = np.rint((xb * inv).astype(np.float32))
    assert np.abs(q).max() <= 127
    dx = (a / np.float32(127.0)).astype(np.float32)
    return (q.astype(np.float64) * dx.astype(np.float64)).reshape(x.shape)


@pytest.mark.parametrize("qtype", Q8X_TYPES)
def test_q8x_is_the_files_weights_times_int8_activations(qtype):
    k = 512
    blocks = random_blocks(qtype, 21, k, seed=5 + TYPES[qtype])
    w = QuantMatrix([(qtype, blocks)], k, int8_activations=True)
    gen = torch.Generator().manual_seed(TYPES[qtype])
    x = torch.randn(6, k, generator=gen)
    x[2, 64:96] = 0.0  # an all-zero block
    bias = torch.randn(21, generator=gen)
    got = gemm_quant(x, w, bias).double()
    weights = gguf_dequantize(qtype, blocks, k).double()
    want = torch.from_numpy(quantized_activations(x)) @ weights.T + bias.double()
    scale = (torch.from_numpy(np.abs(quantized_activations(x))) @ weights.abs().T).max()
    assert (got - want).abs().max() <= 1e-5 * scale
    # and it is not the fp32 product (the activations really are quantized), though near it
    exact = gemm_quant(x, QuantMatrix([(qtype, blocks)], k), bias).double()
    assert not torch.equal(got, exact)
    assert (got - exact).abs().max() <= 0.05 * scale


@pytest.mark.parametrize("row_length", ["short", 1024, 4096])
@pytest.mark.parametrize("qtype", Q8X_TYPES)
def test_q8x_equals_its_reference_whatever_shares_the_call(qtype, row_length, isa):
    # the many-row path takes 9 rows and more of short rows in the VNNI form, 5 and more of
    # rows of 1024 (and of short ones in AVX2), 2 and more of rows of 4096
    k = row_length if row_length != "short" else 256 if BLOCKS[qtype][0] == 256 else 96
    w = QuantMatrix([(qtype, random_blocks(qtype, 37, k, seed=1 + TYPES[qtype]))], k, int8_activations=True)
    gen = torch.Generator().manual_seed(TYPES[qtype])
    # 40 rows: the few-row tiles (up to 8 rows), the many-row path and its chunks of 32
    x = torch.randn(40, k, generator=gen) * torch.rand(40, 1, generator=gen) * 10
    bias = torch.randn(37, generator=gen)
    ref = gemm_quant(x, w, bias, reference=True)
    full = gemm_quant(x, w, bias)
    assert torch.equal(full, ref)
    for m in range(1, 21):
        assert torch.equal(gemm_quant(x[m - 1:2 * m], w, bias), full[m - 1:2 * m]), m
    # one row alone: a decode step's product, which has a path of its own
    for r in range(40):
        assert torch.equal(gemm_quant(x[r:r + 1], w, bias), full[r:r + 1]), ("one row", r)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            assert torch.equal(gemm_quant(x, w, bias), full), threads
    finally:
        torch.set_num_threads(before)


def test_q8x_segments_of_several_types_and_a_float_one(isa):
    k = 512
    parts = [("Q4_K", random_blocks("Q4_K", 24, k, 1)), ("Q6_K", random_blocks("Q6_K", 8, k, 2)),
             ("F16", random_blocks("F16", 5, k, 4)), ("Q8_0", random_blocks("Q8_0", 13, k, 3))]
    fused = QuantMatrix(parts, k, int8_activations=True)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(0))
    got = gemm_quant(x, fused)
    assert torch.equal(got, gemm_quant(x, fused, reference=True))
    alone = [gemm_quant(x, QuantMatrix([p], k, int8_activations=True)) for p in parts]
    assert got.shape == (5, 50) and torch.equal(got, torch.cat(alone, dim=1))
    # a float segment computes as in the gguf precision (fp32 activations)
    assert torch.equal(alone[2], gemm_quant(x, QuantMatrix([parts[2]], k)))


def test_q8x_runs_vnni_where_the_cpu_has_it(isa):
    from dspark.runtime import cpu_matmul
    vnni = {"avx512_vnni", "avx512vl", "avx512bw"} <= cpu_kernels.cpu_flags()
    assert cpu_matmul.q8x_form() == ("avx512-vnni" if isa == "avx512" and vnni else "avx2")


@pytest.mark.parametrize("qtype", Q8X_TYPES)
def test_q8x_panels_hold_the_files_weights(qtype):
    """Rows that do not fill the last panel of 8 columns included."""
    k = 256
    blocks = random_blocks(qtype, 13, k, seed=30 + TYPES[qtype])
    ours = QuantMatrix([(qtype, blocks)], k, int8_activations=True).dequantize()
    assert torch.equal(ours.view(torch.int32), gguf_dequantize(qtype, blocks, k).view(torch.int32))


def test_activations_are_quantized_bit_for_bit_as_the_rule_says():
    """The activation rule of gemm_q8x.c against numpy, every output exact: q (rounded to
    nearest even, ties included), dx = max|x| / 127, sx = dx * sum(q), and the sums of q over
    each unit's halves."""
    import ctypes

    lib = cpu_kernels.load()
    fn = lib.dspark_q8x_quantize_row
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_void_p] * 4
    gen = torch.Generator().manual_seed(3)
    k = 1536
    x = (torch.randn(8, k, generator=gen) * torch.rand(8, 1, generator=gen) * 20).numpy().astype(np.float32)
    x[1, 64:96] = 0.0  # an all-zero unit
    x[2, :32] = np.float32(127.0) / np.arange(1, 33, dtype=np.float32)
    x[3, 32:64] = np.arange(-16, 16, dtype=np.float32) + np.float32(0.5)  # halves: ties to even
    x[3, 63] = np.float32(127.0)  # the largest, so 127 / a = 1 and x * 127 / a stays a tie
    x[4, 96:128] = -np.abs(x[4, 96:128])  # one sign only
    for row in x:
        q = np.zeros(k, np.int8)
        dx, sx = np.zeros(k // 32, np.float32), np.zeros(k // 32, np.float32)
        S = np.zeros(k // 16, np.int32)
        fn(row.ctypes.data, k, q.ctypes.data, dx.ctypes.data, sx.ctypes.data, S.ctypes.data)
        xb = row.reshape(-1, 32)
        a = np.abs(xb).max(axis=1)
        with np.errstate(divide="ignore"):
            inv = np.where(a > 0, np.float32(127.0) / a, np.float32(0.0)).astype(np.float32)
        want_q = np.rint((xb * inv[:, None]).astype(np.float32)).astype(np.int32)
        assert np.array_equal(q.reshape(-1, 32).astype(np.int32), want_q)
        assert np.array_equal(dx.view(np.int32), (a / np.float32(127.0)).astype(np.float32).view(np.int32))
        halves = want_q.reshape(-1, 2, 16).sum(axis=2)
        assert np.array_equal(S.reshape(-1, 2), halves)
        want_sx = (dx * halves.sum(axis=1).astype(np.float32)).astype(np.float32)
        assert np.array_equal(sx.view(np.int32), want_sx.view(np.int32))
