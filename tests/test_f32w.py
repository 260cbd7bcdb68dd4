"""The native fp32-weight kernel (kernels/gemm_f32w.c) and the `fp32` precision on a CPU
built on it: results against an fp64 reference and Hugging Face transformers, and a
token's logits independent of what shares its step (what torch's fp32 matmul does not
guarantee on every CPU)."""

from __future__ import annotations

import pytest
import torch

from dspark.runtime import cpu_kernels, cpu_matmul
from dspark.runtime.batch import FlatBatch
from dspark.runtime.kv_cache import KVCachePool
from dspark.runtime.loader import load_transformer
from dspark.runtime.weight_formats import weight_kind

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f"native kernel unavailable: {cpu_kernels.why_unavailable()}")


@pytest.mark.parametrize("k,n", [(64, 96), (576, 40), (37, 7), (8, 1), (1543, 13), (300, 129)])
def test_f32w_matches_fp64_and_rows_do_not_depend_on_the_batch_or_threads(k, n):
    g = torch.Generator().manual_seed(k * 7 + n)
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g)
    x = torch.randn(53, k, generator=g)
    packed = cpu_matmul.PackedF32(w)
    for bias in (None, b):
        full = cpu_matmul.gemm_f32w(x, packed, bias)
        ref = x.double() @ w.double().T + (0 if bias is None else bias.double())
        assert full.dtype == torch.float32 and full.shape == (53, n)
        torch.testing.assert_close(full.double(), ref, atol=1e-5 * k**0.5, rtol=1e-6)
        # every tiling: 1-3 rows, 4-6, the turn-taking tiles of 7-15, prefill-sized
        for m in (*range(1, 21), 33, 48):
            assert torch.equal(cpu_matmul.gemm_f32w(x[:m], packed, bias), full[:m]), m
        assert torch.equal(cpu_matmul.gemm_f32w(x[17:29], packed, bias), full[17:29])
    threads = torch.get_num_threads()
    threaded = cpu_matmul.gemm_f32w(x, packed, b)
    try:
        torch.set_num_threads(1)
        alone = cpu_matmul.gemm_f32w(x, packed, b)
        packed_on_call = cpu_matmul.gemm_f32w(x, w, b)  # an fp32 tensor, packed by the call
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, threaded) and torch.equal(packed_on_call, threaded)


def test_f32w_variants_give_the_same_bits():
    """AVX-512 and AVX2: the same FMA chain per element (on a CPU without AVX-512 both
    calls would run AVX2, and the comparison could not fail)."""
    if not {"avx512f", "avx512bw"} <= cpu_kernels.cpu_flags():
        pytest.skip("no AVX-512 here: the AVX2 variant is the only one this CPU runs")
    g = torch.Generator().manual_seed(3)
    try:
        for k, n in [(64, 150), (37, 7), (300, 129)]:
            w, x = torch.randn(n, k, generator=g), torch.randn(60, k, generator=g)
            for m in (1, 2, 3, 4, 5, 6, 7, 9, 13, 20, 53, 60):
                cpu_matmul.set_gemm_isa("avx512")
                a = cpu_matmul.gemm_f32w(x[:m], w)
                cpu_matmul.set_gemm_isa("avx2")
                assert torch.equal(a, cpu_matmul.gemm_f32w(x[:m], w)), (k, n, m)
    finally:
        cpu_matmul.set_gemm_isa("avx512")


def test_f32w_rejects_what_it_cannot_run():
    with pytest.raises(TypeError, match="fp32 weight"):
        cpu_matmul.PackedF32(torch.randn(4, 8).to(torch.bfloat16))
    with pytest.raises(ValueError, match="features"):
        cpu_matmul.gemm_f32w(torch.randn(2, 9), torch.randn(4, 8))
    with pytest.raises(ValueError, match="fp32 rows"):
        cpu_matmul.PackedF32.from_panels(torch.zeros(2, 8, 16), 40)


def test_fp32_model_runs_the_kernel_and_matches_transformers(tiny_hf):
    """The fp32 model's linears and decoder stack are native, and its logits over a
    prefill and a continuation are transformers' fp32 ones (up to rounding: the kernel
    sums in its own order)."""
    kind, path, hf = tiny_hf
    model = load_transformer(path, "fp32")
    assert model.precision == "fp32"
    assert {weight_kind(m) for m in model.modules() if isinstance(m, torch.nn.Linear)} == {"f32w"}
    ids = list(range(5, 25))
    cache = KVCachePool(model.cfg, 2, 64, model.dtype)
    slot = cache.allocate(0)
    first = model(FlatBatch.from_requests([ids[:12]], [0], [slot], logits="all"), cache)[0]
    assert model._native_stack is not None
    rest = model(FlatBatch.from_requests([ids[12:]], [12], [slot], logits="all"), cache)[0]
    with torch.no_grad():
        want = hf.float()(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(torch.cat([first, rest]), want, atol=1e-4, rtol=0)


def test_fp32_verification_gives_the_bits_of_decoding_one_by_one(tiny_hf):
    """What speculation's exactness rests on: a request's tokens verified in one step
    beside other requests give bit for bit the logits of feeding them one per step
    alone."""
    kind, path, _ = tiny_hf
    model = load_transformer(path, "fp32")
    prompt, tokens = list(range(3, 40)), [41, 7, 99, 12, 56, 8, 23]

    def fresh():
        cache = KVCachePool(model.cfg, 3, 96, model.dtype)
        slots = [cache.allocate(i) for i in range(3)]
        model(FlatBatch.from_requests([prompt], [0], [slots[0]]), cache)
        return cache, slots

    cache, slots = fresh()
    one_by_one = torch.cat([model(FlatBatch.from_requests([[t]], [len(prompt) + i], [slots[0]], logits="all"),
                                  cache)[0] for i, t in enumerate(tokens)])
    cache, slots = fresh()
    together = model(FlatBatch.from_requests([tokens, [5, 6, 7, 8, 9], [11]], [len(prompt), 0, 0], slots,
                                             logits="all"), cache)[0][:len(tokens)]
    assert torch.equal(one_by_one, together)


def test_fp32_says_when_its_matmuls_are_not_batch_invariant(tiny_hf, monkeypatch):
    """fp32 runs its linears through the native fp32-weight kernel and has nothing to
    say; where the kernels cannot run, torch's fp32 linear is checked at load: a row
    whose bits change with the number of rows in the product is a near-tie risk for
    speculation, and the load says so."""
    from dspark.runtime import precision as loader

    _, path, _ = tiny_hf
    real = torch.nn.functional.linear
    # a linear whose rows do depend on the row count, and one computed row by row
    monkeypatch.setattr(torch.nn.functional, "linear", lambda x, w, b=None: real(x, w, b) * (1 + 1e-7 * x.shape[0]))
    assert not loader.fp32_rows_invariant(16)
    said = []
    model = load_transformer(path, "fp32", log=said.append)
    assert said == [] and weight_kind(model.layers[0].qkv_proj) == "f32w"
    monkeypatch.setattr(cpu_kernels, "available", lambda: False)
    model = load_transformer(path, "fp32", log=said.append)
    assert said == [loader.FP32_NOT_INVARIANT_NOTE] and weight_kind(model.layers[0].qkv_proj) is None
    monkeypatch.setattr(torch.nn.functional, "linear",
                        lambda x, w, b=None: torch.stack([real(r, w, b) for r in x]) if x.dim() == 2 else real(x, w, b))
    assert loader.fp32_rows_invariant(16)
    said.clear()
    load_transformer(path, "fp32", log=said.append)
    assert said == []
