"""The gguf precision's kernel (kernels/gemm_quant.c) on random blocks of every type it
reads: each dequantized weight is bit for bit the `gguf` package's value (the file's
model, as transformers builds it), the matmul is bit for bit its scalar reference on
both ISAs, and a row's output does not depend on how many rows share the call."""

import numpy as np
import pytest
import torch

from dspark.runtime import cpu_kernels, cpu_matmul
from dspark.runtime.quantized import BLOCKS, TYPES, QuantError, QuantMatrix, gemm_quant

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="native kernels unavailable")

#: byte offsets of a block's fp16 fields (scales, mins): random bytes there could be NaN
_HALF_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2),
                "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,), "IQ4_XS": (0,),
                "Q3_K": (108,), "Q2_K": (80, 82)}


def random_blocks(qtype: str, rows: int, k: int, seed: int = 0, exponents: tuple[int, int] = (-14, -4)
                  ) -> torch.Tensor:
    """uint8 [rows, row bytes] of `qtype`: random quants, finite fp16 scales and mins of
    magnitude 2^exponents."""
    rng = np.random.default_rng(seed)
    per, nbytes = BLOCKS[qtype]
    if qtype in ("F32", "F16", "BF16"):
        w = rng.standard_normal((rows, k)).astype(np.float32)
        if qtype == "F32":
            return torch.from_numpy(w.view(np.uint8).reshape(rows, -1).copy())
        if qtype == "F16":
            return torch.from_numpy(w.astype(np.float16).view(np.uint8).reshape(rows, -1).copy())
        return torch.from_numpy(torch.from_numpy(w).to(torch.bfloat16).view(torch.uint8).numpy().reshape(rows, -1)
                                .copy())
    nblk = rows * k // per
    raw = rng.integers(0, 256, size=(nblk, nbytes), dtype=np.uint8)
    for off in _HALF_FIELDS[qtype]:
        half = (rng.uniform(0.5, 2.0, nblk) * 2.0 ** rng.integers(*exponents, nblk)).astype(np.float16)
        half[::7] *= -1  # negative scales and mins occur in files too
        raw[:, off:off + 2] = half.view(np.uint8).reshape(nblk, 2)
    return torch.from_numpy(raw.reshape(rows, -1).copy())


def gguf_dequantize(qtype: str, blocks: torch.Tensor, k: int) -> torch.Tensor:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    if qtype == "F32":
        return blocks.view(torch.float32).clone()
    if qtype == "F16":
        return blocks.view(torch.float16).float()
    if qtype == "BF16":
        return blocks.view(torch.bfloat16).float()
    out = dequantize(blocks.numpy(), GGMLQuantizationType[qtype])
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(blocks.shape[0], k)


@pytest.fixture(params=[0, 256, 512], ids=["reference", "avx2", "avx512"])
def dequant_isa(request):
    lib = cpu_kernels.load()
    if request.param == 512 and "avx512bw" not in cpu_kernels.cpu_flags():
        pytest.skip("this CPU lacks AVX-512")  # the reference and avx2 cases still run
    lib.dspark_quant_set_dequant(request.param)
    yield request.param
    lib.dspark_quant_set_dequant(-1)


@pytest.mark.parametrize("qtype", list(TYPES))
def test_dequantized_values_are_the_gguf_package_values(qtype, dequant_isa):
    k = 512
    blocks = random_blocks(qtype, 9, k, seed=TYPES[qtype])
    ours = QuantMatrix([(qtype, blocks)], k).dequantize()
    ref = gguf_dequantize(qtype, blocks, k)
    assert torch.isfinite(ref).all()
    assert torch.equal(ours.view(torch.int32), ref.view(torch.int32))


@pytest.fixture(params=["avx2", "avx512"])
def isa(request):
    before = cpu_matmul.gemm_isa()
    got = cpu_matmul.set_gemm_isa(request.param)
    if got != request.param:
        cpu_matmul.set_gemm_isa(before)
        pytest.skip("this CPU lacks AVX-512")  # the avx2 case still runs everywhere
    yield got
    cpu_matmul.set_gemm_isa(before)


@pytest.mark.parametrize("qtype", list(TYPES))
def test_matmul_equals_scalar_reference_and_is_row_invariant(qtype, isa):
    k = 256 if BLOCKS[qtype][0] == 256 else 96
    w = QuantMatrix([(qtype, random_blocks(qtype, 37, k, seed=1 + TYPES[qtype]))], k)
    gen = torch.Generator().manual_seed(TYPES[qtype])
    x = torch.randn(16, k, generator=gen)
    bias = torch.randn(37, generator=gen)
    ref = gemm_quant(x, w, bias, reference=True)
    full = gemm_quant(x, w, bias)
    assert torch.equal(full, ref)
    for m in range(1, 16):  # 1 to 16 rows sharing the call: each row the same bits
        assert torch.equal(gemm_quant(x[:m], w, bias), full[:m]), m
    dense = x.double() @ w.dequantize().double().T + bias.double()
    assert torch.allclose(full.double(), dense, rtol=1e-4, atol=1e-3)


def test_segments_of_several_types_fuse(isa):
    k = 512
    parts = [("Q4_K", random_blocks("Q4_K", 24, k, 1)), ("Q6_K", random_blocks("Q6_K", 8, k, 2)),
             ("Q8_0", random_blocks("Q8_0", 13, k, 3))]
    fused = QuantMatrix(parts, k)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(0))
    got = gemm_quant(x, fused)
    alone = torch.cat([gemm_quant(x, QuantMatrix([p], k)) for p in parts], dim=1)
    assert got.shape == (5, 45) and torch.equal(got, alone)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        assert torch.equal(gemm_quant(x, fused), got)


def test_blocks_that_do_not_fit_are_refused():
    with pytest.raises(QuantError, match="not whole Q4_K blocks"):
        QuantMatrix([("Q4_K", random_blocks("Q8_0", 2, 96))], 96)
    with pytest.raises(QuantError, match="not one the gguf kernel reads"):
        QuantMatrix([("IQ2_XXS", torch.zeros(1, 66, dtype=torch.uint8))], 256)
    with pytest.raises(QuantError, match="Q2_K blocks have no q8x form"):
        QuantMatrix([("Q2_K", random_blocks("Q2_K", 8, 256))], 256, int8_activations=True)


def test_the_types_without_a_q8x_form_are_the_kernels():
    from dspark.runtime.quantized import NOT_Q8X, QUANTIZED_TYPES

    lib = cpu_kernels.load()
    assert [t for t in QUANTIZED_TYPES if lib.dspark_q8x_panel_type(TYPES[t]) == 0] == list(NOT_Q8X)


def test_q2k_beside_other_types_fuses_on_every_isa_path(isa):
    """Q2_K has AVX2 units only: on an AVX-512 CPU its decode runs them beside the other
    segments' AVX-512 ones; the bits are the reference's either way, for 1 to 3 rows."""
    k = 512
    parts = [("Q4_K", random_blocks("Q4_K", 9, k, 1)), ("Q2_K", random_blocks("Q2_K", 21, k, 2)),
             ("Q6_K", random_blocks("Q6_K", 8, k, 3))]
    fused = QuantMatrix(parts, k)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(1))
    for m in (1, 2, 3):
        assert torch.equal(gemm_quant(x[:m], fused), gemm_quant(x[:m], fused, reference=True)), m
