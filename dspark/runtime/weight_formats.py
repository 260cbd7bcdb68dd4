"""How a linear layer's weights are stored and computed at inference, and building
modules without random weights.

- `bf16w`: weights in bf16, packed once into the native kernel's panels, computed in
  fp32 (`use_bf16_weights`, `native_panels`, `linear_input_dtype`);
- `fp32` on a CPU: weights in fp32, packed into the same kernel's panels
  (`use_f32_panels`): batch-invariant, unlike torch's fp32 matmul on some CPUs;
- `q8_0` / `q4_0` (a drafter's linears, `use_q8x_weights`): each weight quantized once
  to that GGUF block type and computed by the q8x kernel (int8 activations per 32);
- `bf16` on a CPU: oneDNN with the weight pre-packed (`pack_cpu_bf16_linears`);
- `skip_weight_init`: build `nn.Linear` / `nn.Embedding` whose weights a checkpoint
  replaces next, without drawing random ones.

Each switches a module's `forward` in place; the module keeps its parameters (and
autograd a plain path over them).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from .cpu_matmul import PackedBf16, PackedBf16Dot, PackedF32, gemm_bf16w, gemm_bf16x, gemm_f32w
from .quantized import QuantMatrix, gemm_quant


class _PackedLinearForward:
    """CPU bf16 inference through oneDNN with the weight pre-packed once.

    On these CPUs a pre-packed bf16 weight runs a decode-sized matmul about 2x faster
    than `F.linear` and gives bit-identical results (measured: scripts/dev/bench_runtime.py).
    Used only when autograd is off; training keeps the plain path."""

    def __init__(self, module: nn.Linear) -> None:
        self.module = module
        self.packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), 1)
        self.plain = module.forward

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = self.module
        if torch.is_grad_enabled() or x.dtype != torch.bfloat16 or x.device.type != "cpu":
            return self.plain(x)
        bias = None if m.bias is None else m.bias.detach()
        out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, m.in_features), self.packed, bias, "none", [], "")
        return out.view(*x.shape[:-1], m.out_features)


def pack_cpu_bf16_linears(model: nn.Module) -> int:
    """Switch every bf16 CPU `nn.Linear` of `model` to pre-packed oneDNN weights for
    inference. Returns how many were packed (0 where oneDNN is unavailable)."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return 0
    n = 0
    for mod in model.modules():
        if (isinstance(mod, nn.Linear) and mod.weight.dtype == torch.bfloat16 and mod.weight.device.type == "cpu"
                and "forward" not in mod.__dict__):  # not already switched (bf16w)
            try:
                mod.forward = _PackedLinearForward(mod)
            except RuntimeError:  # this oneDNN build has no bf16 path for this CPU (AVX2 only)
                return n
            n += 1
    return n


class _NativeLinearForward:
    """An `nn.Linear`'s forward through one of the native matmuls, its weight packed
    once (`packed`: the kernel's panels); later in-place changes to the weight are not
    seen. The subclasses say which kernel."""

    module: nn.Linear


class _Bf16WeightLinearForward(_NativeLinearForward):
    """`nn.Linear` with its weight stored in bf16 and computed in fp32 by the native
    AVX2 kernel (`cpu_matmul.gemm_bf16w`): the `bf16w` precision. Autograd keeps a
    plain fp32 path over the same (bf16-rounded) weight values. The weight is packed
    for the kernel once, here: later in-place changes to it are not seen."""

    def __init__(self, module: nn.Linear, packed: PackedBf16 | None = None) -> None:
        self.module = module
        self.packed = packed or PackedBf16(module.weight.detach())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = self.module
        if torch.is_grad_enabled() and (x.requires_grad or m.weight.requires_grad):
            bias = None if m.bias is None else m.bias.float()
            return F.linear(x.float(), m.weight.float(), bias).to(x.dtype)
        return gemm_bf16w(x, self.packed, None if m.bias is None else m.bias.detach()).to(x.dtype)


class _Bf16DotLinearForward(_Bf16WeightLinearForward):
    """The `bf16x` precision's linear: bf16 weights packed in pairs, the fp32 input
    rounded to bf16, fp32 accumulation (`cpu_matmul.gemm_bf16x`: AMX or VDPBF16PS)."""

    def __init__(self, module: nn.Linear) -> None:
        self.module = module
        self.packed = PackedBf16Dot(module.weight.detach())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = self.module
        if torch.is_grad_enabled() and (x.requires_grad or m.weight.requires_grad):
            bias = None if m.bias is None else m.bias.float()
            return F.linear(x.float().to(torch.bfloat16).float(), m.weight.float(), bias).to(x.dtype)
        return gemm_bf16x(x, self.packed, None if m.bias is None else m.bias.detach()).to(x.dtype)


class _F32PanelLinearForward(_NativeLinearForward):
    """The `fp32` precision's linear on a CPU: fp32 weights in the native kernel's
    panels (`cpu_matmul.gemm_f32w`), one FMA chain per output whatever the batch.
    Autograd keeps the plain path."""

    def __init__(self, module: nn.Linear, packed: PackedF32 | None = None) -> None:
        self.module = module
        self.packed = packed or PackedF32(module.weight.detach())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = self.module
        if torch.is_grad_enabled() and (x.requires_grad or m.weight.requires_grad):
            return F.linear(x, m.weight, m.bias)
        return gemm_f32w(x, self.packed, None if m.bias is None else m.bias.detach()).to(x.dtype)


class _QuantLinearForward(_NativeLinearForward):
    """The `gguf` and `q8x` precisions' linear: the file's blocks read in place by the
    native kernel (`quantized.gemm_quant`). Autograd keeps the plain path over the dense
    weight (`dense_weight`: a target's is the blocks dequantized, made when first asked)."""

    def __init__(self, module: nn.Linear, packed: QuantMatrix) -> None:
        if (packed.out_features, packed.in_features) != (module.out_features, module.in_features):
            raise ValueError(f"blocks of [{packed.out_features}, {packed.in_features}] for a linear of "
                             f"[{module.out_features}, {module.in_features}]")
        self.module = module
        self.packed = packed
        self._dense: torch.Tensor | None = None

    def dense(self) -> torch.Tensor:
        """The blocks' exact fp32 weight [N, K] (kept once the grad path has made it; a
        one-off caller, e.g. export, gets a copy that leaves with it)."""
        return self._dense if self._dense is not None else self.packed.dequantize()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = self.module
        if torch.is_grad_enabled() and (x.requires_grad or m.weight.requires_grad):
            w = m.weight
            if w.is_meta:  # served from the blocks: their dense weight, made once for every later step
                if self._dense is None:
                    self._dense = self.packed.dequantize()
                w = self._dense
            return F.linear(x, w.to(x.dtype), None if m.bias is None else m.bias.to(x.dtype))
        return gemm_quant(x, self.packed, None if m.bias is None else m.bias.detach()).to(x.dtype)


def dense_weight(module: nn.Module) -> torch.Tensor:
    """A linear's weight as a dense tensor: its own, or, for a linear served from a GGUF
    file's blocks whose dense copy was never loaded (it stays on the meta device), the
    blocks dequantized (each weight exactly the file's, in fp32)."""
    w = module.weight
    if not w.is_meta:
        return w
    fwd = module.__dict__.get("forward")
    if isinstance(fwd, _QuantLinearForward):
        return fwd.dense()
    raise ValueError(f"a {type(module).__name__} of {list(w.shape)} has no weight loaded")


def use_quantized_weights(model: nn.Module, matrices: dict[str, QuantMatrix]) -> int:
    """Run each linear of `model` named in `matrices` through the gguf kernel over its
    blocks. Returns how many were switched."""
    n = 0
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and name in matrices:
            mod.forward = _QuantLinearForward(mod, matrices[name])
            n += 1
    return n


#: the block types a model's fp32 linears can be quantized to at load (`use_q8x_weights`)
Q8X_WEIGHT_TYPES = ("q8_0", "q4_0")


def use_q8x_weights(model: nn.Module, qtype: str) -> int:
    """Quantize every CPU `nn.Linear` of `model` whose input width is whole blocks of 32
    to GGUF `qtype` ("q8_0" or "q4_0", ggml's rounding, by the `gguf` package) and run it
    through the q8x kernel (int8 activations per 32, batch-invariant). For a drafter:
    its output need not be any reference's, verification is exact. The module's weight
    becomes the blocks' dequantized values (what autograd would see). Returns how many
    linears were switched."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    if qtype not in Q8X_WEIGHT_TYPES:
        raise ValueError(f"weights quantized at load are one of {', '.join(Q8X_WEIGHT_TYPES)}, not {qtype!r}")
    gtype = GGMLQuantizationType[qtype.upper()]
    n = 0
    for mod in model.modules():
        if (isinstance(mod, nn.Linear) and mod.weight.device.type == "cpu" and mod.in_features % 32 == 0
                and "forward" not in mod.__dict__):
            w = mod.weight.detach().to(torch.float32).numpy()
            blocks = torch.from_numpy(np.ascontiguousarray(quantize(w, gtype)).view(np.uint8).copy())
            packed = QuantMatrix([(qtype.upper(), blocks)], mod.in_features, int8_activations=True)
            mod.weight = nn.Parameter(packed.dequantize(), requires_grad=False)
            mod.forward = _QuantLinearForward(mod, packed)
            n += 1
    return n


def weight_kind(mod: nn.Module) -> str | None:
    """"bf16w", "bf16x", "f32w" or "q" (a GGUF file's blocks) for a linear switched to a
    native kernel, else None."""
    fwd = mod.__dict__.get("forward")
    if isinstance(fwd, _QuantLinearForward):
        return "q"
    if isinstance(fwd, _Bf16DotLinearForward):
        return "bf16x"
    if isinstance(fwd, _F32PanelLinearForward):
        return "f32w"
    return "bf16w" if isinstance(fwd, _Bf16WeightLinearForward) else None


def linear_input_dtype(mod: nn.Linear) -> torch.dtype:
    """The dtype a linear's input should have: fp32 for a native linear (bf16w, bf16x:
    bf16 weights, fp32 activations; f32w), else its weight's."""
    return torch.float32 if isinstance(mod.__dict__.get("forward"), _NativeLinearForward) else mod.weight.dtype


def use_bf16_weights(model: nn.Module, panels: dict[str, torch.Tensor] | None = None,
                     embeddings: bool = True, kind: str = "bf16w") -> int:
    """Store every `nn.Linear` weight (and, with `embeddings`, embedding table) of
    `model` in bf16 and run the linears through the native bf16-weight/fp32-compute
    kernel; everything else (norms, rotary tables, KV cache, activations) stays fp32.
    Tied weights stay tied. `panels`: the kernel's packing of each linear by module
    name, made earlier (`native_panels`); the others are packed here. With kind
    "bf16x", linears whose input width is a multiple of 32 take the bf16x kernel
    instead (inputs rounded to bf16; the others stay bf16w). Returns how many linears
    were switched."""
    converted: dict[int, nn.Parameter] = {}

    def to_bf16(p: nn.Parameter) -> nn.Parameter:
        if id(p) not in converted:
            converted[id(p)] = nn.Parameter(p.detach().to(torch.bfloat16), requires_grad=False)
        return converted[id(p)]

    n = 0
    for mod in model.modules():
        if embeddings and isinstance(mod, nn.Embedding):
            mod.weight = to_bf16(mod.weight)
    panels = panels or {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and mod.weight.device.type == "cpu" and "forward" not in mod.__dict__:
            mod.weight = to_bf16(mod.weight)
            if kind == "bf16x" and mod.in_features % 32 == 0:
                mod.forward = _Bf16DotLinearForward(mod)
            else:
                ready = panels.get(name)
                packed = None if ready is None else PackedBf16.from_panels(ready, mod.out_features)
                mod.forward = _Bf16WeightLinearForward(mod, packed)
            n += 1
    return n


def use_f32_panels(model: nn.Module, panels: dict[str, torch.Tensor] | None = None) -> int:
    """Run every fp32 CPU `nn.Linear` of `model` through the native fp32-weight kernel
    (the `fp32` precision on a CPU; the weights stay as they are, for autograd and tied
    embeddings). `panels`: each linear's packing by module name, made earlier
    (`native_panels`); the others are packed here. Returns how many were switched."""
    panels = panels or {}
    n = 0
    for name, mod in model.named_modules():
        if (isinstance(mod, nn.Linear) and mod.weight.device.type == "cpu" and mod.weight.dtype == torch.float32
                and "forward" not in mod.__dict__):
            ready = panels.get(name)
            mod.forward = _F32PanelLinearForward(mod, None if ready is None else
                                                 PackedF32.from_panels(ready, mod.out_features))
            n += 1
    return n


def native_panels(model: nn.Module) -> dict[str, torch.Tensor]:
    """The native kernel's packing of each bf16w or f32w linear of `model`, by module
    name (what a prepared checkpoint keeps, so a later load does not pack again)."""
    return {name: mod.forward.packed.data for name, mod in model.named_modules()
            if weight_kind(mod) in ("bf16w", "f32w")}


@contextmanager
def skip_weight_init():
    """Build `nn.Linear` / `nn.Embedding` without drawing random weights, for modules
    whose weights a checkpoint replaces next. The draw is a quarter of a start-up (and,
    on the meta device, imports torch's decompositions: over a second)."""
    saved = {cls: cls.reset_parameters for cls in (nn.Linear, nn.Embedding)}
    try:
        for cls in saved:
            cls.reset_parameters = _no_init
        yield
    finally:
        for cls, fn in saved.items():
            cls.reset_parameters = fn


def _no_init(self: nn.Module) -> None:
    pass
