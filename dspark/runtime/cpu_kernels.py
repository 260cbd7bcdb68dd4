"""Native CPU kernels, compiled on first use with the system C compiler.

- `gemm_bf16w` (kernels/gemm_bf16w.c): fp32 activations times bf16 weights with fp32
  accumulation, AVX2 + FMA, and an AVX-512 variant that gives the same bits on CPUs
  that have it (`gemm_isa`, `set_gemm_isa`), the weights pre-packed (`PackedBf16`). It is the `bf16w`
  precision of the runtime: on CPUs without avx512_bf16, torch has no fast bf16
  matmul (its bf16 kernels are slower than fp32 there), while decode is bound by
  reading the weights; this kernel reads half the bytes of fp32.
- `gemm_f32w` (kernels/gemm_f32w.c): the same matmul (kernels/gemm_panels.h) over fp32
  weights in panels (`PackedF32`): the `fp32` precision's linears on a CPU, where
  torch's fp32 matmul is not batch-invariant on every CPU.
- `gemm_bf16dot` (kernels/gemm_bf16dot.c): the `bf16x` precision on CPUs with
  avx512_bf16: bf16 weights, activations rounded to bf16 at the matmul's input, fp32
  accumulation by VDPBF16PS (twice the multiply-adds of an fp32 FMA), weights packed
  in pairs (`PackedBf16Dot`).
- `attention_f32` (kernels/attention_f32.c): writes a step's keys and values into the
  KV cache and attends, each token over its own slot's positions.
- `rmsnorm_f32`, `silu_mul_f32`, `rope_f32_` (kernels/elementwise_f32.c).
- `dspark_decoder_layers` (kernels/decoder_f32.c): all of a native model's decoder
  layers through the kernels above in one call (`native_stack.NativeStack`).

Each computes a row the same way whatever the batch, so verification, chunked prefill
and one-token decoding agree bit for bit.

The shared library is built once per source version into
`$DSPARK_CACHE_DIR/kernels` (default `~/.cache/dspark/kernels`) with
`cc -O3 -mavx2 -mfma -fopenmp`, written aside and renamed so concurrent first uses
cannot see a half-written file. Where there is no compiler, no AVX2/FMA or the build
fails, `load()` returns None and callers keep the torch paths (`why_unavailable()`
says why). Set `DSPARK_NO_NATIVE=1` to turn the kernels off.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

_SOURCES = [Path(__file__).with_name("kernels") / name for name in ("gemm_bf16w.c", "gemm_f32w.c",
                                                                  "gemm_bf16dot.c", "attention_f32.c", "elementwise_f32.c",
                                                                  "decoder_f32.c")]
# -ffp-contract=off: only the FMAs written out as intrinsics are fused.
_FLAGS = ["-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC"]
_lib: ctypes.CDLL | None = None
_why: str | None = None
_loaded = False


def cache_dir() -> Path:
    root = os.environ.get("DSPARK_CACHE_DIR") or Path.home() / ".cache" / "dspark"
    return Path(root) / "kernels"


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _build(target: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc/gcc) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run([cc, *_FLAGS, "-o", tmp, *map(str, _SOURCES)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[-500:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build_id() -> str:
    """A digest of the kernels' sources and flags: names the built library, and keys
    caches of measurements that depend on the kernels (step-time tables)."""
    sources = [*_SOURCES, *sorted(_SOURCES[0].parent.glob("*.h"))]
    return hashlib.sha256(b"".join(p.read_bytes() for p in sources) + " ".join(_FLAGS).encode()).hexdigest()[:16]


def load() -> ctypes.CDLL | None:
    """The compiled kernel library, building it on first use; None where it cannot run."""
    global _lib, _why, _loaded
    if _loaded:
        return _lib
    _loaded = True
    if os.environ.get("DSPARK_NO_NATIVE"):
        _why = "DSPARK_NO_NATIVE is set"
        return None
    missing = {"avx2", "fma"} - cpu_flags()
    if missing:
        _why = f"this CPU lacks {', '.join(sorted(missing))}"
        return None
    path = cache_dir() / f"dspark_kernels-{build_id()}.so"
    try:
        if not path.is_file():
            _build(path)
        lib = ctypes.CDLL(str(path))
    except (OSError, RuntimeError) as e:
        _why = f"could not build the native kernel: {e}"
        return None
    fn = lib.dspark_gemm_bf16w_packed
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    fn.restype = None
    lib.dspark_gemm_f32w_packed.argtypes = fn.argtypes
    lib.dspark_gemm_f32w_packed.restype = None
    lib.dspark_gemm_bf16w_set_isa.argtypes = [ctypes.c_int]
    lib.dspark_gemm_bf16w_set_isa.restype = ctypes.c_int
    lib.dspark_gemm_bf16w_isa.restype = ctypes.c_int
    if os.environ.get("DSPARK_GEMM_ISA", "").lower() == "avx2":
        lib.dspark_gemm_bf16w_set_isa(256)
    fn = lib.dspark_attention_f32
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 6 + [
        ctypes.c_float, ctypes.c_int]
    fn.restype = ctypes.c_int
    lib.dspark_rmsnorm_f32.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_float, ctypes.c_int]
    lib.dspark_silu_mul_f32.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_int]
    lib.dspark_rope_f32.argtypes = [ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 3
    lib.dspark_gemm_bf16dot_packed.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    lib.dspark_gemm_bf16dot_packed.restype = None
    lib.dspark_gemm_bf16dot_available.restype = ctypes.c_int
    lib.dspark_gemm_bf16amx_packed.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    lib.dspark_gemm_bf16amx_packed.restype = None
    lib.dspark_amx_available.restype = ctypes.c_int
    lib.dspark_gemm_bf16x_packed.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    lib.dspark_gemm_bf16x_packed.restype = None
    lib.dspark_argmax_f32.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
    for name in ("dspark_rmsnorm_f32", "dspark_silu_mul_f32", "dspark_rope_f32", "dspark_argmax_f32"):
        getattr(lib, name).restype = None
    _lib = lib
    return lib


def gemm_isa() -> str | None:
    """The bf16w and f32w matmuls' variant in use: "avx512" or "avx2" (None without the kernels)."""
    lib = load()
    return None if lib is None else ("avx512" if lib.dspark_gemm_bf16w_isa() == 512 else "avx2")


def set_gemm_isa(isa: str) -> str:
    """Use the "avx2" or the "avx512" variant of the bf16w and f32w matmuls (both give the same
    bits; "avx512" falls back to "avx2" on CPUs without it); returns the one in use.
    `DSPARK_GEMM_ISA=avx2` does the same at load."""
    lib = load()
    if lib is None:
        raise RuntimeError(f"native kernels unavailable: {_why}")
    if isa not in ("avx2", "avx512"):
        raise ValueError(f"isa must be 'avx2' or 'avx512', got {isa!r}")
    return "avx512" if lib.dspark_gemm_bf16w_set_isa(512 if isa == "avx512" else 256) == 512 else "avx2"


def why_unavailable() -> str | None:
    load()
    return _why


def available() -> bool:
    return load() is not None


#: the order of a panel's 16 columns in memory (see kernels/gemm_bf16w.c)
_PANEL_ORDER = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]


class PackedBf16:
    """A bf16 weight [N, K] laid out for the kernel: ceil(N / 16) panels of [K][16]."""

    def __init__(self, weight: torch.Tensor) -> None:
        if weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or weight.dim() != 2:
            raise TypeError("gemm_bf16w takes a CPU bf16 weight [out_features, in_features]")
        n, k = weight.shape
        p = (n + 15) // 16
        padded = weight.new_zeros(p * 16, k)
        padded[:n] = weight
        order = torch.tensor(_PANEL_ORDER)
        self.data = padded.view(p, 16, k)[:, order].transpose(1, 2).contiguous()  # [p, K, 16]
        self.out_features, self.in_features = n, k

    @classmethod
    def from_panels(cls, data: torch.Tensor, out_features: int) -> "PackedBf16":
        """A packing made earlier (its `data`, e.g. mapped from a prepared checkpoint)."""
        p, k, width = data.shape
        if data.dtype != torch.bfloat16 or width != 16 or p != (out_features + 15) // 16:
            raise ValueError(f"panels {tuple(data.shape)} {data.dtype} do not hold {out_features} bf16 rows")
        self = cls.__new__(cls)
        self.data, self.out_features, self.in_features = data, out_features, k
        return self


def _run_packed(fn, x: torch.Tensor, packed, bias: torch.Tensor | None, name: str) -> torch.Tensor:
    """x [..., K] through a packed-weight matmul kernel `fn` of the library -> [..., N] fp32."""
    n, k = packed.out_features, packed.in_features
    if x.shape[-1] != k:
        raise ValueError(f"input has {x.shape[-1]} features, the weight expects {k}")
    if x.device.type != "cpu":
        raise TypeError(f"{name} takes CPU activations")
    x2 = x.reshape(-1, k).to(torch.float32).contiguous()
    b = None if bias is None else bias.to(torch.float32).contiguous()
    out = torch.empty(x2.shape[0], n, dtype=torch.float32)
    if x2.shape[0]:
        fn(x2.data_ptr(), packed.data.data_ptr(), None if b is None else b.data_ptr(), out.data_ptr(), x2.shape[0],
           n, k, torch.get_num_threads())
    return out.view(*x.shape[:-1], n)


def gemm_bf16w(x: torch.Tensor, weight: "torch.Tensor | PackedBf16",
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] fp32 @ weight[N, K].T (bf16) (+ bias [N] fp32) -> [..., N] fp32.
    `weight` is a bf16 tensor (packed on every call) or, for repeated use, a
    `PackedBf16` of it."""
    lib = load()
    if lib is None:
        raise RuntimeError(f"native bf16w kernel unavailable: {_why}")
    packed = weight if isinstance(weight, PackedBf16) else PackedBf16(weight)
    return _run_packed(lib.dspark_gemm_bf16w_packed, x, packed, bias, "gemm_bf16w")


class PackedF32:
    """An fp32 weight [N, K] laid out for the f32w kernel: ceil(N / 16) panels of [K][16],
    the 16 columns in order."""

    def __init__(self, weight: torch.Tensor) -> None:
        if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
            raise TypeError("gemm_f32w takes a CPU fp32 weight [out_features, in_features]")
        n, k = weight.shape
        p = (n + 15) // 16
        padded = weight.new_zeros(p * 16, k)
        padded[:n] = weight
        self.data = padded.view(p, 16, k).transpose(1, 2).contiguous()  # [p, K, 16]
        self.out_features, self.in_features = n, k

    @classmethod
    def from_panels(cls, data: torch.Tensor, out_features: int) -> "PackedF32":
        """A packing made earlier (its `data`, e.g. mapped from a prepared checkpoint)."""
        p, k, width = data.shape
        if data.dtype != torch.float32 or width != 16 or p != (out_features + 15) // 16:
            raise ValueError(f"panels {tuple(data.shape)} {data.dtype} do not hold {out_features} fp32 rows")
        self = cls.__new__(cls)
        self.data, self.out_features, self.in_features = data, out_features, k
        return self


def gemm_f32w(x: torch.Tensor, weight: "torch.Tensor | PackedF32",
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] fp32 @ weight[N, K].T (fp32) (+ bias [N]) -> [..., N] fp32, each
    element one FMA chain over k ascending: batch-invariant. `weight` is an fp32 tensor
    (packed on every call) or, for repeated use, a `PackedF32` of it."""
    lib = load()
    if lib is None:
        raise RuntimeError(f"native f32w kernel unavailable: {_why}")
    packed = weight if isinstance(weight, PackedF32) else PackedF32(weight)
    return _run_packed(lib.dspark_gemm_f32w_packed, x, packed, bias, "gemm_f32w")


class PackedBf16Dot:
    """A bf16 weight [N, K] (K even) laid out for the bf16x kernel: ceil(N / 16) panels
    of [K / 2][16][2], each column's weights for inputs 2j and 2j + 1 side by side."""

    def __init__(self, weight: torch.Tensor) -> None:
        if weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or weight.dim() != 2 or weight.shape[1] % 2:
            raise TypeError("gemm_bf16dot takes a CPU bf16 weight [out_features, in_features], in_features even")
        n, k = weight.shape
        p = (n + 15) // 16
        padded = weight.new_zeros(p * 16, k)
        padded[:n] = weight
        self.data = padded.view(p, 16, k // 2, 2).permute(0, 2, 1, 3).contiguous()  # [p, K/2, 16, 2]
        self.out_features, self.in_features = n, k


def bf16dot_available() -> bool:
    """Whether this CPU runs the bf16x kernel (avx512_bf16) and the kernels are built."""
    lib = load()
    return lib is not None and bool(lib.dspark_gemm_bf16dot_available())


def gemm_bf16dot(x: torch.Tensor, packed: PackedBf16Dot, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] fp32, rounded to bf16, @ weight[N, K].T (+ bias) with fp32 accumulation."""
    if not bf16dot_available():
        raise RuntimeError("the bf16x kernel needs a CPU with avx512_bf16 and the native kernels")
    return _run_packed(_lib.dspark_gemm_bf16dot_packed, x, packed, bias, "gemm_bf16dot")


def amx_available() -> bool:
    """Whether this CPU runs AMX bf16 tiles here (asks Linux for them once)."""
    lib = load()
    return lib is not None and bool(lib.dspark_amx_available())


def gemm_bf16amx(x: torch.Tensor, packed: PackedBf16Dot, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`gemm_bf16dot` on AMX tiles (in_features a multiple of 32)."""
    if not amx_available():
        raise RuntimeError("AMX bf16 tiles are not available on this CPU")
    if packed.in_features % 32:
        raise ValueError(f"the AMX kernel needs in_features a multiple of 32, not {packed.in_features}")
    return _run_packed(_lib.dspark_gemm_bf16amx_packed, x, packed, bias, "gemm_bf16amx")


def bf16x_kernel() -> str | None:
    """The bf16x precision's matmul on this CPU: "amx", "avx512_bf16", or None."""
    if amx_available():
        return "amx"
    return "avx512_bf16" if bf16dot_available() else None


def gemm_bf16x(x: torch.Tensor, packed: PackedBf16Dot, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The bf16x matmul: AMX tiles where available (in_features a multiple of 32), else
    VDPBF16PS; the same choice for every call of a process."""
    if bf16x_kernel() is None:
        raise RuntimeError("the bf16x precision needs a CPU with avx512_bf16 (or AMX) and the native kernels")
    return _run_packed(_lib.dspark_gemm_bf16x_packed, x, packed, bias, "gemm_bf16x")


def _lib_or_raise() -> ctypes.CDLL:
    lib = load()
    if lib is None:
        raise RuntimeError(f"native CPU kernels unavailable: {_why}")
    return lib


def _f32_rows(x: torch.Tensor, what: str) -> torch.Tensor:
    if x.dtype != torch.float32 or x.device.type != "cpu" or not x.is_contiguous():
        raise TypeError(f"{what} takes a contiguous fp32 CPU tensor")
    return x


def attention_f32(qkv: torch.Tensor, num_heads: int, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Write each token's key and value into the cache at (its slot, its position), then
    attend: token t sees keys 0..positions[t] of slot slots[t] (causal, GQA, scale
    1/sqrt(head_dim)). qkv [N, (heads + 2 kv_heads) * head_dim] fp32 (queries, keys,
    values; rows may be strided), caches [S, kv_heads, L, head_dim] contiguous fp32;
    slots and positions [N] int64. Returns [N, heads, head_dim]."""
    lib = _lib_or_raise()
    s, kvh, length, d = k_cache.shape
    n, width = qkv.shape
    if d % 8 or num_heads % kvh or width != (num_heads + 2 * kvh) * d or qkv.stride(1) != 1:
        raise ValueError(f"attention_f32: qkv {tuple(qkv.shape)} does not fit {num_heads} heads and a cache "
                         f"{tuple(k_cache.shape)}")
    if qkv.dtype != torch.float32 or qkv.device.type != "cpu":
        raise TypeError("attention_f32 takes fp32 CPU activations")
    _f32_rows(k_cache, "attention_f32's cache")
    _f32_rows(v_cache, "attention_f32's cache")
    slots = slots.to(torch.int64).contiguous()
    positions = positions.to(torch.int64).contiguous()
    out = qkv.new_empty(n, num_heads, d)
    if n and lib.dspark_attention_f32(qkv.data_ptr(), qkv.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
                                      slots.data_ptr(), positions.data_ptr(), out.data_ptr(),
                                      n, s, num_heads, kvh, d, length, d ** -0.5, torch.get_num_threads()):
        raise IndexError(f"attention_f32: a slot or position is outside the cache ({s} slots, {length} positions)")
    return out


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """`x.argmax(dim=-1)` (int64, first maximal index, NaN largest), through the native
    kernel for fp32 CPU rows and torch otherwise."""
    lib = load()
    if (lib is None or x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() < 1 or not x.shape[-1]
            or x.requires_grad):
        return x.argmax(dim=-1)
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty(rows.shape[0], dtype=torch.int64)
    lib.dspark_argmax_f32(rows.data_ptr(), rows.shape[0], rows.shape[1], out.data_ptr(), torch.get_num_threads())
    return out.view(x.shape[:-1])


def rmsnorm_f32(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / sqrt(mean(x^2) + eps) over the last dimension, fp32."""
    lib = _lib_or_raise()
    x = _f32_rows(x.contiguous(), "rmsnorm_f32")
    w = _f32_rows(weight, "rmsnorm_f32")
    k = x.shape[-1]
    if w.shape != (k,):
        raise ValueError(f"rmsnorm_f32: weight {tuple(w.shape)} for rows of {k}")
    out = torch.empty_like(x)
    lib.dspark_rmsnorm_f32(x.data_ptr(), w.data_ptr(), out.data_ptr(), x.numel() // max(k, 1), k, eps,
                           torch.get_num_threads())
    return out


def silu_mul_f32(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2 I] = [gate | up] -> silu(gate) * up [..., I], fp32."""
    lib = _lib_or_raise()
    gu = _f32_rows(gate_up.contiguous(), "silu_mul_f32")
    i = gu.shape[-1] // 2
    out = gu.new_empty(*gu.shape[:-1], i)
    lib.dspark_silu_mul_f32(gu.data_ptr(), out.data_ptr(), gu.numel() // max(2 * i, 1), i, torch.get_num_threads())
    return out


def rope_f32_(x: torch.Tensor, num_heads: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """In place: rotate the first `num_heads` heads of each row of x [N, width] (fp32,
    rows may be strided) by the rotary tables cos, sin [N, head_dim]. Returns x."""
    lib = _lib_or_raise()
    n, d = cos.shape
    if x.dim() != 2 or x.shape[0] != n or x.stride(1) != 1 or num_heads * d > x.shape[1] or d % 2:
        raise ValueError(f"rope_f32_: rows {tuple(x.shape)}, {num_heads} heads, tables {tuple(cos.shape)}")
    if x.dtype != torch.float32 or x.device.type != "cpu":
        raise TypeError("rope_f32_ takes fp32 CPU activations")
    cos = _f32_rows(cos, "rope_f32_")
    sin = _f32_rows(sin, "rope_f32_")
    if n:
        lib.dspark_rope_f32(x.data_ptr(), x.stride(0), cos.data_ptr(), sin.data_ptr(), n, num_heads, d)
    return x
