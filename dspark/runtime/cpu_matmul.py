"""The native matmuls over packed weights (kernels/gemm_panels.h and gemm_bf16dot.c),
for `nn.Linear`s at inference (runtime/weight_formats.py):

- `gemm_bf16w`: fp32 activations times bf16 weights, fp32 accumulation (`PackedBf16`);
- `gemm_f32w`: the same matmul over fp32 weights (`PackedF32`), the `fp32` precision's;
- `gemm_bf16x`: activations rounded to bf16, fp32 accumulation, on AMX tiles
  (`gemm_bf16amx`) or avx512_bf16 dot products (`gemm_bf16dot`), weights in pairs
  (`PackedBf16Dot`).

Each packs a weight [N, K] once into panels of 16 output columns and computes every
output element as one fixed chain of fused multiply-adds over k, whatever the rows,
tiles and threads: a token's row does not depend on what shares its step. bf16w and
f32w have an AVX2 and an AVX-512 variant giving the same bits (`gemm_isa`,
`set_gemm_isa`). The library is built and loaded by `cpu_kernels`.
"""

from __future__ import annotations

import torch

from .cpu_kernels import load, why_unavailable


def gemm_isa() -> str | None:
    """The bf16w and f32w matmuls' variant in use: "avx512" or "avx2" (None without the kernels)."""
    lib = load()
    return None if lib is None else ("avx512" if lib.dspark_gemm_bf16w_isa() == 512 else "avx2")


def q8x_form() -> str | None:
    """The q8x matmul's integer products: "avx512-vnni" (vpdpbusd, where the CPU has it and
    the "avx512" variant is in use) or "avx2"; both give the same bits."""
    lib = load()
    if lib is None:
        return None
    return "avx512-vnni" if lib.dspark_gemm_bf16w_isa() == 512 and lib.dspark_q8x_vnni_available() else "avx2"


def set_gemm_isa(isa: str) -> str:
    """Use the "avx2" or the "avx512" variant of the bf16w, f32w and quantized matmuls (each
    gives the same bits in both; "avx512" falls back to "avx2" on CPUs without it); returns the one in use.
    `DSPARK_GEMM_ISA=avx2` does the same at load."""
    lib = load()
    if lib is None:
        raise RuntimeError(f"native kernels unavailable: {why_unavailable()}")
    if isa not in ("avx2", "avx512"):
        raise ValueError(f"isa must be 'avx2' or 'avx512', got {isa!r}")
    return "avx512" if lib.dspark_gemm_bf16w_set_isa(512 if isa == "avx512" else 256) == 512 else "avx2"


#: the order of a panel's 16 columns in memory (see kernels/gemm_bf16w.c)
_PANEL_ORDER = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]


class _Panels:
    """A weight [N, K] laid out for a panel kernel (kernels/gemm_panels.h): ceil(N / 16)
    panels of [K][16], the 16 columns in the subclass's `ORDER` (None: in order)."""

    DTYPE: torch.dtype
    KIND: str  # the dtype's name, for messages
    NAME: str  # the kernel, for messages
    ORDER: list[int] | None = None

    def __init__(self, weight: torch.Tensor) -> None:
        if weight.dtype != self.DTYPE or weight.device.type != "cpu" or weight.dim() != 2:
            raise TypeError(f"{self.NAME} takes a CPU {self.KIND} weight [out_features, in_features]")
        n, k = weight.shape
        p = (n + 15) // 16
        padded = weight.new_zeros(p * 16, k).view(p, 16, k)
        padded.view(p * 16, k)[:n] = weight
        if self.ORDER is not None:
            padded = padded[:, torch.tensor(self.ORDER)]
        self.data = padded.transpose(1, 2).contiguous()  # [p, K, 16]
        self.out_features, self.in_features = n, k

    @classmethod
    def from_panels(cls, data: torch.Tensor, out_features: int):
        """A packing made earlier (its `data`, e.g. mapped from a prepared checkpoint)."""
        p, k, width = data.shape
        if data.dtype != cls.DTYPE or width != 16 or p != (out_features + 15) // 16:
            raise ValueError(f"panels {tuple(data.shape)} {data.dtype} do not hold {out_features} {cls.KIND} rows")
        self = cls.__new__(cls)
        self.data, self.out_features, self.in_features = data, out_features, k
        return self


class PackedBf16(_Panels):
    """A bf16 weight [N, K] laid out for the bf16w kernel, each panel's columns in the
    order its widening loads want (`_PANEL_ORDER`, see kernels/gemm_bf16w.c)."""

    DTYPE, KIND, NAME, ORDER = torch.bfloat16, "bf16", "gemm_bf16w", _PANEL_ORDER


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
        raise RuntimeError(f"native bf16w kernel unavailable: {why_unavailable()}")
    packed = weight if isinstance(weight, PackedBf16) else PackedBf16(weight)
    return _run_packed(lib.dspark_gemm_bf16w_packed, x, packed, bias, "gemm_bf16w")


class PackedF32(_Panels):
    """An fp32 weight [N, K] laid out for the f32w kernel, the 16 columns in order."""

    DTYPE, KIND, NAME = torch.float32, "fp32", "gemm_f32w"


def gemm_f32w(x: torch.Tensor, weight: "torch.Tensor | PackedF32",
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] fp32 @ weight[N, K].T (fp32) (+ bias [N]) -> [..., N] fp32, each
    element one FMA chain over k ascending: batch-invariant. `weight` is an fp32 tensor
    (packed on every call) or, for repeated use, a `PackedF32` of it."""
    lib = load()
    if lib is None:
        raise RuntimeError(f"native f32w kernel unavailable: {why_unavailable()}")
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
    return _run_packed(load().dspark_gemm_bf16dot_packed, x, packed, bias, "gemm_bf16dot")


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
    return _run_packed(load().dspark_gemm_bf16amx_packed, x, packed, bias, "gemm_bf16amx")


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
    return _run_packed(load().dspark_gemm_bf16x_packed, x, packed, bias, "gemm_bf16x")


