"""The native bf16-weight kernel and the bf16w precision built on it: results against
an fp64 reference and Hugging Face transformers, and independence from the batch."""

from __future__ import annotations

import pytest
import torch
from conftest import BF16X_PRECISIONS

from dspark.runtime import cpu_kernels, cpu_matmul
from dspark.runtime.batch import FlatBatch
from dspark.runtime.kv_cache import KVCachePool
from dspark.runtime.loader import load_transformer
from dspark.runtime.precision import choose_precision, parse_precision

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f"native kernel unavailable: {cpu_kernels.why_unavailable()}")


@pytest.mark.parametrize("k,n", [(64, 96), (576, 40), (37, 7), (8, 1), (1543, 13)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_matches_fp64_reference(k, n, bias):
    g = torch.Generator().manual_seed(k * 31 + n)
    w = torch.randn(n, k, generator=g).to(torch.bfloat16)
    b = torch.randn(n, generator=g) if bias else None
    for m in (1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 33):
        x = torch.randn(m, k, generator=g)
        got = cpu_matmul.gemm_bf16w(x, w, b)
        ref = x.double() @ w.double().T + (0 if b is None else b.double())
        assert got.dtype == torch.float32 and got.shape == (m, n)
        torch.testing.assert_close(got.double(), ref, atol=1e-4 * k**0.5, rtol=1e-5)


def test_gemm_rows_do_not_depend_on_the_batch_or_threads():
    """Each output element is computed the same way whatever rows share the call and
    however many threads run: bit-identical, the property verification relies on."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(45, 300, generator=g).to(torch.bfloat16)
    x = torch.randn(17, 300, generator=g)
    full = cpu_matmul.gemm_bf16w(x, w)
    for i in range(17):
        assert torch.equal(cpu_matmul.gemm_bf16w(x[i : i + 1], w), full[i : i + 1])
    assert torch.equal(cpu_matmul.gemm_bf16w(x[3:11], w), full[3:11])
    for m in range(1, 17):  # every tiling: 1-3 rows, 4-6, the turn-taking tiles of 7-15, prefill-sized
        assert torch.equal(cpu_matmul.gemm_bf16w(x[:m], w), full[:m]), m
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(cpu_matmul.gemm_bf16w(x, w), full)
    finally:
        torch.set_num_threads(threads)
    # leading dimensions are kept
    assert torch.equal(cpu_matmul.gemm_bf16w(x.view(1, 17, 300), w)[0], full)


def test_gemm_variants_give_the_same_bits():
    """The AVX-512 variant (where the CPU has it) and the AVX2 one compute every output
    element as the same FMA chain: equal bits for every shape, tile and remainder."""
    flags = cpu_kernels.cpu_flags()
    wide = {"avx512f", "avx512bw"} <= flags
    g = torch.Generator().manual_seed(7)
    try:
        assert cpu_matmul.set_gemm_isa("avx512") == ("avx512" if wide else "avx2")
        assert cpu_matmul.gemm_isa() == ("avx512" if wide else "avx2")
        for k, n in [(64, 150), (576, 40), (37, 7), (300, 129), (8, 1)]:
            w = torch.randn(n, k, generator=g).to(torch.bfloat16)
            b = torch.randn(n, generator=g)
            x = torch.randn(101, k, generator=g)
            # up to 20 rows: every tile and remainder; then prefill-sized row counts
            for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 20, 48, 53, 101):
                for bias in (None, b):
                    cpu_matmul.set_gemm_isa("avx512")
                    a = cpu_matmul.gemm_bf16w(x[:m], w, bias)
                    cpu_matmul.set_gemm_isa("avx2")
                    c = cpu_matmul.gemm_bf16w(x[:m], w, bias)
                    assert torch.equal(a, c), (k, n, m, bias is not None)
    finally:
        cpu_matmul.set_gemm_isa("avx512")
    with pytest.raises(ValueError):
        cpu_matmul.set_gemm_isa("sse")


def test_gemm_rejects_what_it_cannot_run():
    w = torch.randn(4, 8).to(torch.bfloat16)
    with pytest.raises(ValueError, match="features"):
        cpu_matmul.gemm_bf16w(torch.randn(2, 9), w)
    with pytest.raises(TypeError, match="bf16 weight"):
        cpu_matmul.gemm_bf16w(torch.randn(2, 8), w.float())


def _bf16_rounded_hf(hf):
    """The Hugging Face model with every linear/embedding weight rounded to bf16, run in
    fp32: what bf16w computes."""
    import copy

    ref = copy.deepcopy(hf)
    with torch.no_grad():
        for mod in ref.modules():
            if isinstance(mod, (torch.nn.Linear, torch.nn.Embedding)):
                mod.weight.copy_(mod.weight.to(torch.bfloat16).float())
    return ref


def test_bf16w_model_matches_transformers_with_rounded_weights(tiny_hf):
    kind, path, hf = tiny_hf
    model = load_transformer(path, "bf16w")
    assert model.precision == "bf16w" and model.dtype == torch.float32
    assert model.layers[0].qkv_proj.weight.dtype == torch.bfloat16
    ref = _bf16_rounded_hf(hf)
    ids = list(range(5, 25))
    cache = KVCachePool(model.cfg, 2, 64, model.dtype)
    slot = cache.allocate(0)
    first = model(FlatBatch.from_requests([ids[:12]], [0], [slot], logits="all"), cache)[0]
    rest = model(FlatBatch.from_requests([ids[12:]], [12], [slot], logits="all"), cache)[0]
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(torch.cat([first, rest]), want, atol=1e-4, rtol=0)


def test_precision_names_and_auto_choice(tiny_hf):
    kind, path, _ = tiny_hf
    assert parse_precision("float32", "cpu") == "fp32" and parse_precision("bfloat16", "cuda") == "bf16"
    # on a CPU, bf16 means bf16 weights through a batch-invariant kernel, never oneDNN's
    assert parse_precision("bfloat16", "cpu") == ("bf16x" if BF16X_PRECISIONS else "bf16w")
    assert parse_precision(None, "cpu") == "auto"
    with pytest.raises(ValueError, match="unknown dtype"):
        parse_precision("int4", "cpu")
    model = load_transformer(path, torch.float32)
    picked, line = choose_precision(model.cfg, repeats=2)
    # auto picks only precisions whose every kernel is batch-invariant (tested in this
    # file and by the greedy exactness tests), never oneDNN bf16, also where it is faster
    assert picked in ("fp32", "bf16w", *BF16X_PRECISIONS) and line.startswith(f"dtype auto: {picked}")
    said = []
    auto = load_transformer(path, "auto", log=said.append)
    assert auto.precision in ("fp32", "bf16w", *BF16X_PRECISIONS) and said and said[0].startswith("dtype auto:")
    said.clear()
    asked_bf16 = load_transformer(path, "bf16", log=said.append)
    assert asked_bf16.precision in ("bf16w", *BF16X_PRECISIONS)
    assert said and said[0].startswith(f"dtype bf16 on a CPU: {asked_bf16.precision}")


def _cache_and_tokens(g, slots=4, kvh=3, heads=9, length=64, d=64):
    kc, vc = torch.randn(slots, kvh, length, d, generator=g), torch.randn(slots, kvh, length, d, generator=g)
    # three tokens of one request (a verification), a first token, a lone decode
    tok_slots, pos = torch.tensor([1, 1, 1, 3, 0]), torch.tensor([10, 11, 12, 0, 40])
    qkv = torch.randn(5, (heads + 2 * kvh) * d, generator=g)
    return kc, vc, tok_slots, pos, qkv


def test_attention_kernel_matches_fp64_sdpa_and_writes_the_cache():
    g = torch.Generator().manual_seed(3)
    heads, kvh, d = 9, 3, 64
    kc, vc, slots, pos, qkv = _cache_and_tokens(g)
    want_k, want_v = kc.clone(), vc.clone()
    q, k, v = qkv.view(5, heads + 2 * kvh, d).split([heads, kvh, kvh], dim=1)
    want_k[slots, :, pos] = k
    want_v[slots, :, pos] = v
    out = cpu_kernels.attention_f32(qkv, heads, kc, vc, slots, pos)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    for t in range(5):
        s, p = int(slots[t]), int(pos[t])
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[t].unsqueeze(1).double(), want_k[s, :, : p + 1].double(), want_v[s, :, : p + 1].double(),
            enable_gqa=True)[:, 0]
        torch.testing.assert_close(out[t].double(), ref, atol=2e-6, rtol=0)


def test_attention_kernel_rows_do_not_depend_on_the_batch():
    g = torch.Generator().manual_seed(4)
    kc, vc, slots, pos, qkv = _cache_and_tokens(g)
    full = cpu_kernels.attention_f32(qkv, 9, kc, vc, slots, pos)
    for t in range(5):
        one = cpu_kernels.attention_f32(qkv[t : t + 1], 9, kc, vc, slots[t : t + 1], pos[t : t + 1])
        assert torch.equal(one[0], full[t])
    with pytest.raises(IndexError, match="outside the cache"):
        cpu_kernels.attention_f32(qkv[:1], 9, kc, vc, slots[:1], torch.tensor([64]))
    with pytest.raises(IndexError, match="outside the cache"):
        cpu_kernels.attention_f32(qkv[:1], 9, kc, vc, torch.tensor([4]), pos[:1])
    with pytest.raises(ValueError, match="does not fit"):
        cpu_kernels.attention_f32(qkv[:, :-8], 9, kc, vc, slots, pos)


@pytest.mark.parametrize("heads,kvh", [(9, 3), (32, 1), (4, 4)])
@pytest.mark.parametrize("threads", [1, 2])
def test_attention_kernel_runs_of_tokens_give_each_token_alone(heads, kvh, threads):
    """Tokens of one slot in one call (a 21-token verification across key blocks, next to
    a 3-token one and a decode; the kernel serves them in runs that share the key and
    value reads) give bit for bit what each token gets alone, and match fp64."""
    g = torch.Generator().manual_seed(6)
    d, length = 64, 96
    kc, vc = torch.randn(3, kvh, length, d, generator=g), torch.randn(3, kvh, length, d, generator=g)
    slots = torch.tensor([2] * 21 + [0] * 3 + [1])
    pos = torch.cat([torch.arange(37, 58), torch.arange(5, 8), torch.tensor([70])])
    qkv = torch.randn(len(slots), (heads + 2 * kvh) * d, generator=g)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        full = cpu_kernels.attention_f32(qkv, heads, kc, vc, slots, pos)
        for t in range(len(slots)):
            one = cpu_kernels.attention_f32(qkv[t : t + 1], heads, kc, vc, slots[t : t + 1], pos[t : t + 1])
            assert torch.equal(one[0], full[t]), t
    finally:
        torch.set_num_threads(saved)
    q = qkv.view(len(slots), heads + 2 * kvh, d)[:, :heads]
    for t in (0, 20, 23, 24):
        s, p = int(slots[t]), int(pos[t])
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[t].unsqueeze(1).double(), kc[s, :, : p + 1].double(), vc[s, :, : p + 1].double(),
            enable_gqa=True)[:, 0]
        torch.testing.assert_close(full[t].double(), ref, atol=2e-6, rtol=0)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_attention_kernel_each_isa_matches_fp64_and_is_batch_invariant(isa):
    """The AVX2 attention and, on a CPU with AVX-512, the 16-lane one that reads each key
    once per group of heads (the ISA of the process's matmuls decides): every
    head-group size (1, 2, 3 heads per group and more than 3), context lengths on and
    off the blocks of keys scored together (4 on AVX2, 8 on AVX-512), fp64 SDPA to 2e-6, and each token alone equal to it in a
    batch."""
    if isa == "avx512" and not {"avx512f", "avx512bw"} <= cpu_kernels.cpu_flags():
        pytest.skip("no AVX-512 here: the AVX2 case covers this CPU")
    g = torch.Generator().manual_seed(9)
    try:
        assert cpu_matmul.set_gemm_isa(isa) == isa
        for heads, kvh, d in [(9, 3, 64), (4, 2, 64), (8, 8, 32), (14, 2, 48), (5, 1, 64)]:
            length = 40
            kc, vc = torch.randn(2, kvh, length, d, generator=g), torch.randn(2, kvh, length, d, generator=g)
            slots = torch.tensor([1] * 9 + [0] * 3)
            pos = torch.cat([torch.arange(14, 23), torch.tensor([0, 7, 8])])
            qkv = torch.randn(len(slots), (heads + 2 * kvh) * d, generator=g)
            full = cpu_kernels.attention_f32(qkv, heads, kc, vc, slots, pos)
            q = qkv.view(len(slots), heads + 2 * kvh, d)[:, :heads]
            for t in range(len(slots)):
                one = cpu_kernels.attention_f32(qkv[t : t + 1], heads, kc, vc, slots[t : t + 1], pos[t : t + 1])
                assert torch.equal(one[0], full[t]), (heads, kvh, d, t)
                s, p = int(slots[t]), int(pos[t])
                ref = torch.nn.functional.scaled_dot_product_attention(
                    q[t].unsqueeze(1).double(), kc[s, :, : p + 1].double(), vc[s, :, : p + 1].double(),
                    enable_gqa=True)[:, 0]
                torch.testing.assert_close(full[t].double(), ref, atol=2e-6, rtol=0)
    finally:
        cpu_matmul.set_gemm_isa("avx512")


def test_elementwise_kernels_match_torch():
    from dspark.runtime.model import rotate_half

    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(7, 581, generator=g) * 3, torch.randn(581, generator=g)
    ref = w.double() * (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5))
    torch.testing.assert_close(cpu_kernels.rmsnorm_f32(x, w, 1e-5).double(), ref, atol=1e-5, rtol=1e-5)
    gu = torch.randn(5, 2 * 203, generator=g) * 6
    gate, up = gu.double().chunk(2, dim=-1)
    torch.testing.assert_close(cpu_kernels.silu_mul_f32(gu).double(), torch.nn.functional.silu(gate) * up,
                               atol=1e-5, rtol=1e-5)
    heads, d = 4, 64
    rows = torch.randn(3, (heads + 2) * d, generator=g)
    ang = torch.randn(3, d // 2, generator=g)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    want = rows.clone().view(3, heads + 2, d)
    want[:, :heads] = want[:, :heads] * cos.unsqueeze(1) + rotate_half(want[:, :heads]) * sin.unsqueeze(1)
    got = cpu_kernels.rope_f32_(rows, heads, cos, sin)
    assert torch.equal(got, want.view(3, -1))  # the same operations as torch: bit for bit


def test_native_and_torch_paths_agree(tiny_hf, monkeypatch):
    """The fp32 model with the native kernels (attention, norms, rotary, SiLU) against
    the same model on torch operators only: a prefill beside a short request, then a
    verification beside a decode."""
    kind, path, _ = tiny_hf
    model = load_transformer(path, "fp32")
    assert model._native_attention(KVCachePool(model.cfg, 1, 8, model.dtype))

    def run():
        cache = KVCachePool(model.cfg, 2, 64, model.dtype)
        a, b = cache.allocate(0), cache.allocate(1)
        # a prompt longer than the native kernel's queries next to a short one: both paths in one step
        out = [model(FlatBatch.from_requests([list(range(5, 45)), list(range(30, 33))], [0, 0], [a, b],
                                             logits="all"), cache)[0]]
        out.append(model(FlatBatch.from_requests([[40, 41, 42, 43], [50]], [40, 3], [a, b], logits="all"), cache)[0])
        return torch.cat(out)

    native = run()
    monkeypatch.setattr(cpu_kernels, "available", lambda: False)
    assert not model._native_attention(KVCachePool(model.cfg, 1, 8, model.dtype))
    torch.testing.assert_close(native, run(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("precision", BF16X_PRECISIONS)
def test_bf16x_model_matches_transformers_with_rounded_weights_and_inputs(tiny_hf, precision):
    """bf16x against an independent reference: the Hugging Face model with bf16-rounded
    weights, run in fp32 with every linear's input rounded to bf16 (a forward pre-hook),
    over a prefill and a continuation."""
    kind, path, hf = tiny_hf
    model = load_transformer(path, precision)
    assert model.precision == "bf16x" and model.dtype == torch.float32
    ref = _bf16_rounded_hf(hf)
    for mod in ref.modules():
        if isinstance(mod, torch.nn.Linear):
            mod.register_forward_pre_hook(lambda m, args: (args[0].to(torch.bfloat16).float(),))
    ids = list(range(5, 25))
    cache = KVCachePool(model.cfg, 2, 64, model.dtype)
    slot = cache.allocate(0)
    first = model(FlatBatch.from_requests([ids[:12]], [0], [slot], logits="all"), cache)[0]
    rest = model(FlatBatch.from_requests([ids[12:]], [12], [slot], logits="all"), cache)[0]
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(torch.cat([first, rest]), want, atol=2e-3, rtol=0)


@pytest.mark.parametrize("precision", ["bf16w", *BF16X_PRECISIONS])
def test_native_stack_gives_the_layer_by_layer_bits(tiny_hf, monkeypatch, precision):
    """A bf16w model's decoder layers in one native call (native_stack.py) against the
    same model layer by layer: logits, tapped hidden states (with and without the
    embeddings) and the KV cache bit for bit, over a prefill beside a decode and a
    verification beside a decode, Qwen3's per-head q/k norms included."""
    kind, path, _ = tiny_hf
    model = load_transformer(path, precision)
    assert model.precision == precision

    def run(stacked: bool):
        if stacked:
            monkeypatch.delenv("DSPARK_NO_NATIVE_STACK", raising=False)
        else:
            monkeypatch.setenv("DSPARK_NO_NATIVE_STACK", "1")
        model._stack_key = None
        cache = KVCachePool(model.cfg, 2, 64, model.dtype)
        a, b = cache.allocate(0), cache.allocate(1)
        first = model(FlatBatch.from_requests([list(range(5, 45)), list(range(30, 33))], [0, 0], [a, b],
                                              logits="all"), cache, [-1, 0, 1])
        second = model(FlatBatch.from_requests([[40, 41, 42, 43], [50]], [40, 3], [a, b], logits="all"),
                       cache, [1, 0])
        kv = [t[s, :, :n] for t in (*cache.k, *cache.v) for s, n in ((a, 44), (b, 4))]
        return [*first, *second, *kv], model._native_stack

    layered, none = run(False)
    stacked, stack = run(True)
    assert none is None
    assert stack is not None
    for want, got in zip(layered, stacked):
        assert torch.equal(want, got)


def test_native_argmax_is_torchs_argmax():
    """The greedy argmax kernel against torch.argmax: random rows of every tail length,
    ties (the first maximal index), NaN (counted largest, the first wins), all -inf,
    and a maximum in the unvectorised tail."""
    if not cpu_kernels.available():
        pytest.skip(f"native kernel unavailable: {cpu_kernels.why_unavailable()}")
    torch.manual_seed(0)
    for k in (1, 7, 8, 9, 63, 49152):
        x = torch.randn(5, k)
        assert torch.equal(cpu_kernels.argmax_rows(x), x.argmax(-1))
    x = torch.randn(6, 101)
    x[0, [3, 50, 99]] = 9.0  # ties
    x[1, [10, 40]] = float("nan")
    x[2] = float("-inf")
    x[3, 100] = 9.0  # in the tail past the last full vector
    x[4, [5, 6]] = torch.tensor([0.0, -0.0]) + 50  # equal values
    x[5, 0] = float("nan")
    assert torch.equal(cpu_kernels.argmax_rows(x), x.argmax(-1))
    assert cpu_kernels.argmax_rows(x[:, :-1].contiguous().view(2, 3, 100)).shape == (2, 3)
    assert torch.equal(cpu_kernels.argmax_rows(x.double()), x.double().argmax(-1))  # torch for other dtypes


@pytest.mark.parametrize("kernel", ["dot", "amx", "bf16x"])
def test_bf16x_matmul_rounds_inputs_and_is_batch_invariant(kernel):
    """The bf16x kernels (VDPBF16PS, AMX tiles, and the per-process choice between
    them) against a float64 product of the bf16-rounded inputs, and each row's result
    the same whatever rows share the call (every M from 1 to 37, odd sizes, bias)."""
    have = {"dot": cpu_matmul.bf16dot_available(), "amx": cpu_matmul.amx_available(),
            "bf16x": cpu_matmul.bf16x_kernel() is not None}
    if not have[kernel]:
        pytest.skip(f"this CPU has no {kernel} kernel (AVX2-only CPUs run bf16w instead)")
    fn = {"dot": cpu_matmul.gemm_bf16dot, "amx": cpu_matmul.gemm_bf16amx, "bf16x": cpu_matmul.gemm_bf16x}[kernel]
    torch.manual_seed(0)
    for n, k in ((100, 64), (3072, 576), (45, 1536)):
        w = torch.randn(n, k).to(torch.bfloat16)
        bias = torch.randn(n)
        packed = cpu_matmul.PackedBf16Dot(w)
        x = torch.randn(37, k)
        full = fn(x, packed, bias)
        want = x.to(torch.bfloat16).double() @ w.double().T + bias.double()
        torch.testing.assert_close(full.double(), want, atol=2e-4 * k ** 0.5, rtol=1e-5)
        for m in range(1, 38):
            assert torch.equal(fn(x[:m], packed, bias), full[:m])
        assert torch.equal(fn(x[5:6], packed, bias), full[5:6])
        assert torch.equal(fn(x[11:30], packed, bias), full[11:30])
