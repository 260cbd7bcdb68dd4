"""Native CPU kernels, compiled on first use with the system C compiler.

- the matmuls over packed weights (kernels/gemm_panels.h via gemm_bf16w.c and
  gemm_f32w.c, kernels/gemm_bf16dot.c): the `bf16w`, `fp32` and `bf16x` precisions'
  linears, called through `cpu_matmul` (`gemm_bf16w`, `gemm_f32w`, `gemm_bf16x`). On
  CPUs without avx512_bf16 torch has no fast bf16 matmul, while decode is bound by
  reading the weights: bf16w reads half the bytes of fp32;
- `attention_f32` (kernels/attention_f32.c): writes a step's keys and values into the
  KV cache and attends, each token over its own slot's positions.
- `rmsnorm_f32`, `silu_mul_f32`, `rope_f32_`, `argmax_rows` (kernels/elementwise_f32.c).
- `topk_rows` (kernels/select_f32.c): a draft's candidates, the top C of each row.
- `gemm_quant` (kernels/gemm_quant.c): the `gguf` precision's matmul, over a GGUF
  file's quantized blocks as stored (`quantized.py`); its q8x matrices (int8
  activations) go to kernels/gemm_q8x.c, over panels packed by kernels/q8x_panels.c.
- `dspark_decoder_layers` (kernels/decoder_f32.c): all of a native model's decoder
  layers through the kernels above in one call (`native_stack.NativeStack`).

Each computes a row the same way whatever the batch, so verification, chunked prefill
and one-token decoding agree bit for bit.

The shared library is built once per source version into
`kernels/` of the cache root (`dspark.runtime.cache`: `$DSPARK_CACHE`, default
`~/.cache/dspark`) with
`cc -O3 -mavx2 -mfma -mf16c -fopenmp`, written aside and renamed so concurrent first uses
cannot see a half-written file. Where there is no compiler, no AVX2/FMA/F16C or the build
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

from .cache import cache_root
# re-exported: callers and tests ask the kernels which ISA they may use
from .machine import cpu_flags  # noqa: F401

_SOURCES = [Path(__file__).with_name("kernels") / name for name in (
    "gemm_bf16w.c", "gemm_f32w.c", "gemm_bf16dot.c", "attention_f32.c", "elementwise_f32.c", "decoder_f32.c",
    "select_f32.c", "gemm_quant.c", "gemm_q8x.c", "gemm_q8x_vnni.c", "q8x_panels.c", "quant_repack.c")]
# -ffp-contract=off: only the FMAs written out as intrinsics are fused.
_FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC"]
_lib: ctypes.CDLL | None = None
_why: str | None = None
_loaded = False


def cache_dir() -> Path:
    return cache_root() / "kernels"


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
    missing = {"avx2", "fma", "f16c"} - cpu_flags()
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
    lib.dspark_q8x_vnni_available.restype = ctypes.c_int
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
    lib.dspark_topk_f32.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 2 + [ctypes.c_int]
    lib.dspark_topk_f32.restype = ctypes.c_int
    lib.dspark_gemm_quant.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    lib.dspark_gemm_quant.restype = None
    lib.dspark_gemm_quant_ref.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3
    lib.dspark_gemm_quant_ref.restype = None
    lib.dspark_dequant_rows.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_void_p]
    lib.dspark_dequant_rows.restype = None
    lib.dspark_quant_repacked_type.argtypes = [ctypes.c_int]
    lib.dspark_quant_repacked_type.restype = ctypes.c_int
    lib.dspark_quant_repack.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_void_p]
    lib.dspark_quant_repack.restype = None
    lib.dspark_q8x_group_bytes.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.dspark_q8x_group_bytes.restype = ctypes.c_int64
    lib.dspark_q8x_panel_type.argtypes = [ctypes.c_int]
    lib.dspark_q8x_panel_type.restype = ctypes.c_int
    lib.dspark_q8x_pack.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                    ctypes.c_void_p]
    lib.dspark_q8x_pack.restype = None
    lib.dspark_q8x_dequant.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.dspark_q8x_dequant.restype = None
    lib.dspark_quant_set_fused.argtypes = [ctypes.c_int]
    lib.dspark_quant_set_fused.restype = None
    lib.dspark_quant_set_dequant.argtypes = [ctypes.c_int]
    lib.dspark_quant_set_dequant.restype = None
    lib.dspark_quant_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.dspark_quant_rows.restype = ctypes.c_int64
    lib.dspark_quant_block.argtypes = [ctypes.c_int, ctypes.c_void_p]
    lib.dspark_quant_block.restype = ctypes.c_int64
    for name in ("dspark_rmsnorm_f32", "dspark_silu_mul_f32", "dspark_rope_f32", "dspark_argmax_f32"):
        getattr(lib, name).restype = None
    _lib = lib
    return lib


def why_unavailable() -> str | None:
    load()
    return _why


def available() -> bool:
    return load() is not None


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


def topk_rows(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`x.topk(k, dim=-1)` (values, int64 indices; descending, equal values by ascending
    index), through the native kernel for fp32 CPU rows, and torch otherwise (and for
    rows holding a NaN). About 20 us a row of 8192 in torch, about 10 here."""
    lib = load()
    n = x.shape[-1] if x.dim() else 0
    if (lib is None or x.dtype != torch.float32 or x.device.type != "cpu" or not 0 < k <= min(n, 1020)
            or n >= 2 ** 31 or x.requires_grad):
        return x.topk(k, dim=-1)
    rows = x.reshape(-1, n).contiguous()
    vals = torch.empty(rows.shape[0], k, dtype=torch.float32)
    idx = torch.empty(rows.shape[0], k, dtype=torch.int64)
    if lib.dspark_topk_f32(rows.data_ptr(), rows.shape[0], n, k, vals.data_ptr(), idx.data_ptr(),
                           torch.get_num_threads()):
        return x.topk(k, dim=-1)
    return vals.view(*x.shape[:-1], k), idx.view(*x.shape[:-1], k)


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
