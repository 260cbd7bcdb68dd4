"""A bf16w model's decoder layers in one native call (kernels/decoder_f32.c).

The layer-by-layer path makes about ten calls into the native kernels per layer, each
from Python with its argument checks and new output tensors: some 300 calls and a few
milliseconds per step of a 30-layer model, a sixth of a one-token decode step on two
cores. `NativeStack` hands the kernel every layer's packed weights and cache at once;
the kernel runs the same kernels in the same order, so the result is bit for bit the
layer-by-layer one (tests/test_cpu_kernels.py). `DSPARK_NO_NATIVE_STACK=1` keeps the
layer-by-layer path (for comparisons).
"""

from __future__ import annotations

import ctypes
import os
import weakref

import torch
from torch import nn

from . import cpu_kernels
from .weight_formats import _Bf16WeightLinearForward

#: per layer, in the order kernels/decoder_f32.c reads them
_PTRS = ("qkv_w", "qkv_b", "o_w", "gu_w", "down_w", "ln1", "ln2", "k_cache", "v_cache")


def _packed(mod: nn.Linear) -> torch.Tensor | None:
    fwd = mod.__dict__.get("forward")
    return fwd.packed.data if isinstance(fwd, _Bf16WeightLinearForward) else None


class NativeStack:
    """Runs `layers` (DecoderLayer modules of one model, every linear bf16w) in one
    call. Build with `for_layers`, which returns None where the kernel does not apply."""

    def __init__(self, layers: nn.ModuleList, lib: ctypes.CDLL) -> None:
        cfg = layers[0].cfg
        self.cfg, self.lib = cfg, lib
        self._keep: list[torch.Tensor] = []  # tensors whose addresses the kernel gets
        rows = []
        for layer in layers:
            bias = layer.qkv_proj.bias
            if bias is not None:
                bias = bias.detach().to(torch.float32).contiguous()
                self._keep.append(bias)
            ln1 = layer.input_layernorm.weight.detach()
            ln2 = layer.post_attention_layernorm.weight.detach()
            weights = [_packed(layer.qkv_proj), _packed(layer.o_proj), _packed(layer.gate_up_proj),
                       _packed(layer.down_proj)]
            self._keep += [*weights, ln1, ln2]
            rows.append([weights[0].data_ptr(), 0 if bias is None else bias.data_ptr(), weights[1].data_ptr(),
                         weights[2].data_ptr(), weights[3].data_ptr(), ln1.data_ptr(), ln2.data_ptr(), 0, 0])
        self.ptrs = torch.tensor(rows, dtype=torch.int64)
        self._cache: weakref.ref | None = None
        self._cols: tuple[tuple, torch.Tensor | None] = ((None,), None)  # tap layers -> column per layer
        fn = lib.dspark_decoder_bf16w
        fn.argtypes = ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p] + [ctypes.c_int64] * 8
                       + [ctypes.c_void_p] * 4 + [ctypes.c_float] * 2 + [ctypes.c_void_p] * 3
                       + [ctypes.c_int64, ctypes.c_int])
        fn.restype = ctypes.c_int

    @classmethod
    def for_layers(cls, layers: nn.ModuleList) -> "NativeStack | None":
        """A stack for these layers, or None: no native kernels, `DSPARK_NO_NATIVE_STACK`
        set, a linear not bf16w, a norm not fp32, per-head q/k norms, or a bias the
        kernel does not take (only the qkv projection may have one)."""
        lib = cpu_kernels.load()
        if lib is None or os.environ.get("DSPARK_NO_NATIVE_STACK") or not len(layers):
            return None
        for layer in layers:
            if layer.cfg.qk_norm or any(b is not None for b in (layer.o_proj.bias, layer.gate_up_proj.bias,
                                                                layer.down_proj.bias)):
                return None
            if any(_packed(m) is None for m in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj,
                                                layer.down_proj)):
                return None
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                w = norm.weight
                if w.dtype != torch.float32 or w.device.type != "cpu" or not w.is_contiguous():
                    return None
        return cls(layers, lib)

    def _bind(self, cache) -> None:
        if self._cache is not None and self._cache() is cache:
            return
        self.ptrs[:, 7] = torch.tensor([k.data_ptr() for k in cache.k], dtype=torch.int64)
        self.ptrs[:, 8] = torch.tensor([v.data_ptr() for v in cache.v], dtype=torch.int64)
        self._cache = weakref.ref(cache)

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, token_slots: torch.Tensor,
            positions: torch.Tensor, tap_layers: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, hidden] (fp32, the embeddings; not modified) through every layer.
        Returns (the last layer's output, taps [N, len(tap_layers), hidden]: the output
        of each layer in `tap_layers`, distinct indices >= 0)."""
        cfg = self.cfg
        n, hidden = x.shape
        s, kvh, length, d = cache.k[0].shape
        self._bind(cache)
        x = x.contiguous().clone()
        ntaps = len(tap_layers)
        taps = x.new_empty(n, ntaps, hidden)
        key = tuple(tap_layers)
        if self._cols[0] != key:  # the same taps every step of an engine
            cols = torch.full((len(self.ptrs),), -1, dtype=torch.int64)
            for c, i in enumerate(tap_layers):
                cols[i] = c
            self._cols = (key, cols)
        cols = self._cols[1]
        inter = cfg.intermediate_size
        width = (cfg.num_heads + 2 * kvh) * d
        scratch = x.new_empty(n * (2 * hidden + width + cfg.num_heads * d + 3 * inter))
        cos, sin = cos.contiguous(), sin.contiguous()
        slots = token_slots.to(torch.int64).contiguous()
        pos = positions.to(torch.int64).contiguous()
        if self.lib.dspark_decoder_bf16w(
                x.data_ptr(), n, self.ptrs.data_ptr(), len(self.ptrs), hidden, cfg.num_heads, kvh, d, inter, s,
                length, cos.data_ptr(), sin.data_ptr(), slots.data_ptr(), pos.data_ptr(), cfg.rms_norm_eps,
                d ** -0.5, scratch.data_ptr(), taps.data_ptr(), cols.data_ptr(), ntaps, torch.get_num_threads()):
            raise IndexError(f"attention: a slot or position is outside the cache ({s} slots, {length} positions)")
        return x, taps
