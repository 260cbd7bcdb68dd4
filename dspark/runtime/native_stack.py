"""A model's decoder layers in one native call (kernels/decoder_f32.c), for weights
in a native kernel's panels (bf16w, bf16x, or fp32 on a CPU: f32w) or a GGUF file's
blocks (the gguf precision: each linear a `quantized.QuantMatrix` descriptor).

The layer-by-layer path makes about ten calls into the native kernels per layer, each
from Python with its argument checks and new output tensors: some 300 calls and a few
milliseconds per step of a 30-layer model, a sixth of a one-token decode step on two
cores. `NativeStack` hands the kernel every layer's packed weights and cache at once;
the kernel runs the same kernels in the same order, so the result is bit for bit the
layer-by-layer one (tests/test_cpu_kernels.py). `DSPARK_NO_NATIVE_STACK=1` keeps the
layer-by-layer path (for comparisons).

A drafter's block runs through the same kernel (`for_drafter_layers`): its queries
attend to the request's context keys and to the whole block, not causally (`visible`).
"""

from __future__ import annotations

import ctypes
import os
import weakref

import torch
from torch import nn

from . import cpu_kernels
from .weight_formats import _NativeLinearForward, weight_kind

#: per layer, in the order kernels/decoder_f32.c reads them
_PTRS = ("qkv_w", "qkv_b", "o_w", "gu_w", "down_w", "ln1", "ln2", "k_cache", "v_cache", "q_norm", "k_norm")
_K_CACHE, _V_CACHE = _PTRS.index("k_cache"), _PTRS.index("v_cache")


def _packed(mod: nn.Linear) -> torch.Tensor | None:
    fwd = mod.__dict__.get("forward")
    return fwd.packed.data if isinstance(fwd, _NativeLinearForward) else None


#: the kernel's code for each weight kind (kernels/decoder_f32.c `gemm`)
_KINDS = {"bf16w": 0, "bf16x": 1, "f32w": 2, "q": 3}


def _one_kind(mods) -> str | None:
    """The weight kind all of `mods` share, or None (mixed, or not native)."""
    kinds = {weight_kind(m) for m in mods}
    return kinds.pop() if len(kinds) == 1 and None not in kinds else None


def _fp32_norm(norm: nn.Module | None) -> bool:
    w = None if norm is None else norm.weight
    return w is None or (w.dtype == torch.float32 and w.device.type == "cpu" and w.is_contiguous())


class NativeStack:
    """Runs a model's decoder layers in one call. Build with `for_layers` (the runtime's
    `DecoderLayer`s) or `for_drafter_layers` (a drafter's `DrafterLayer`s), which return
    None where the kernel does not apply."""

    def __init__(self, cfg, parts: list[dict], lib: ctypes.CDLL, kind: str = "bf16w") -> None:
        """parts: per layer, the packed panels "qkv", "o", "gu", "down" (bf16 or fp32), the fp32
        "qkv_b" (or None), "ln1", "ln2" and the per-head "q_norm", "k_norm" (or None).
        kind: the weights' kind, "bf16w", "bf16x" or "f32w" (one for all)."""
        self.cfg, self.lib, self.kind = cfg, lib, _KINDS[kind]
        self._context = None  # a drafter's (fc panels, hidden_norm weight, tap width)
        self._keep: list[torch.Tensor] = []  # tensors whose addresses the kernel gets
        rows = []
        for p in parts:
            p = {k: (None if v is None else v.detach().contiguous()) for k, v in p.items()}
            self._keep += [v for v in p.values() if v is not None]
            ptr = {k: 0 if v is None else v.data_ptr() for k, v in p.items()}
            rows.append([ptr["qkv"], ptr["qkv_b"], ptr["o"], ptr["gu"], ptr["down"], ptr["ln1"], ptr["ln2"], 0, 0,
                         ptr["q_norm"], ptr["k_norm"]])
        self.ptrs = torch.tensor(rows, dtype=torch.int64)
        self._cache: weakref.ref | None = None
        self._cols: tuple[tuple, torch.Tensor | None] = ((None,), None)  # tap layers -> column per layer
        fn = lib.dspark_decoder_layers
        fn.argtypes = ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p] + [ctypes.c_int64] * 8
                       + [ctypes.c_void_p] * 5 + [ctypes.c_float] * 2 + [ctypes.c_void_p] * 3
                       + [ctypes.c_int64, ctypes.c_int, ctypes.c_int])
        fn.restype = ctypes.c_int

    @staticmethod
    def _lib() -> ctypes.CDLL | None:
        lib = cpu_kernels.load()
        return None if lib is None or os.environ.get("DSPARK_NO_NATIVE_STACK") else lib

    @classmethod
    def for_layers(cls, layers: nn.ModuleList) -> "NativeStack | None":
        """A stack for the runtime's decoder layers, or None: no native kernels,
        `DSPARK_NO_NATIVE_STACK` set, a linear not native (bf16w, bf16x, f32w), a norm not
        fp32, or a bias the kernel does not take (only the qkv projection may have one)."""
        lib = cls._lib()
        if lib is None or not len(layers):
            return None
        kind = _one_kind(m for layer in layers for m in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj,
                                                         layer.down_proj))
        if kind is None:
            return None
        parts = []
        for layer in layers:
            if any(b is not None for b in (layer.o_proj.bias, layer.gate_up_proj.bias, layer.down_proj.bias)):
                return None
            weights = [_packed(m) for m in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)]
            norms = [layer.input_layernorm, layer.post_attention_layernorm, getattr(layer, "q_norm", None),
                     getattr(layer, "k_norm", None)]
            if any(w is None for w in weights) or not all(map(_fp32_norm, norms)):
                return None
            bias = layer.qkv_proj.bias
            parts.append(dict(zip(("qkv", "o", "gu", "down"), weights),
                              qkv_b=None if bias is None else bias.to(torch.float32),
                              **dict(zip(("ln1", "ln2", "q_norm", "k_norm"),
                                         (None if n is None else n.weight for n in norms)))))
        return cls(layers[0].cfg, parts, lib, kind)

    @classmethod
    def for_drafter_layers(cls, cfg, layers: nn.ModuleList, fc: nn.Linear | None = None,
                           hidden_norm: nn.Module | None = None) -> "NativeStack | None":
        """A stack for a drafter's layers (`drafters.layers.DrafterLayer`, separate
        q/k/v and gate/up projections, packed here side by side), or None as above.
        The packed panels are 16 columns wide and every projection's width a multiple
        of 16, so the fused matmul gives each column the bits of the separate one.
        With `fc` and `hidden_norm` (a KV-injecting drafter's context projection),
        `context_kv` writes context keys and values too."""
        lib = cls._lib()
        if lib is None or not len(layers) or cfg.head_dim % 8:
            return None
        lins_all = [m for layer in layers for m in (layer.self_attn.q_proj, layer.self_attn.k_proj,
                                                    layer.self_attn.v_proj, layer.self_attn.o_proj,
                                                    layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)]
        kind = _one_kind(lins_all + ([fc] if fc is not None else []))
        if kind is None:
            return None

        def joined(mods) -> torch.Tensor:
            if kind != "q":
                return torch.cat([_packed(m) for m in mods])
            # one descriptor over the linears' own segments (their panels live with them)
            segs = [_packed(m) for m in mods]
            return torch.cat([torch.tensor([sum(int(d[0]) for d in segs)], dtype=torch.int64)] + [d[1:] for d in segs])

        context = None
        if fc is not None:
            if fc.bias is not None or _packed(fc) is None or fc.out_features % 16 or not _fp32_norm(hidden_norm):
                return None
            context = (_packed(fc), hidden_norm.weight.detach().contiguous(), fc.in_features)
        parts = []
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            lins = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
            norms = [layer.input_layernorm, layer.post_attention_layernorm, getattr(attn, "q_norm", None),
                     getattr(attn, "k_norm", None)]
            if (any(_packed(m) is None or m.out_features % 16 for m in lins) or not all(map(_fp32_norm, norms))
                    or any(m.bias is not None for m in lins[3:])):
                return None
            qkv = lins[:3]
            bias = None
            if any(m.bias is not None for m in qkv):
                bias = torch.cat([m.bias.float() if m.bias is not None else m.weight.new_zeros(m.out_features,
                                  dtype=torch.float32) for m in qkv])
            parts.append(dict(qkv=joined(qkv), qkv_b=bias, o=_packed(attn.o_proj),
                              gu=joined((mlp.gate_proj, mlp.up_proj)), down=_packed(mlp.down_proj),
                              **dict(zip(("ln1", "ln2", "q_norm", "k_norm"),
                                         (None if n is None else n.weight for n in norms)))))
        stack = cls(cfg, parts, lib, kind)
        stack._context = context
        if context is not None:
            fn = lib.dspark_drafter_context
            fn.argtypes = ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 3
                           + [ctypes.c_int64] * 7 + [ctypes.c_void_p] * 4
                           + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_int])
            fn.restype = ctypes.c_int
        return stack

    def _bind(self, cache) -> None:
        if self._cache is not None and self._cache() is cache:
            return
        self.ptrs[:, _K_CACHE] = torch.tensor([k.data_ptr() for k in cache.k], dtype=torch.int64)
        self.ptrs[:, _V_CACHE] = torch.tensor([v.data_ptr() for v in cache.v], dtype=torch.int64)
        self._cache = weakref.ref(cache)

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, token_slots: torch.Tensor,
            positions: torch.Tensor, tap_layers: list[int],
            visible: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, hidden] (fp32, the embeddings; not modified) through every layer; each
        token's keys and values go to the cache at (its slot, its position) and it
        attends to keys 0..position (causal) or, given `visible` [N], to the first
        visible[t] keys of its slot (a drafter's block sees all of itself). Returns (the
        last layer's output, taps [N, len(tap_layers), hidden]: the output of each
        layer in `tap_layers`, distinct indices >= 0)."""
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
        vis = None if visible is None else visible.to(torch.int64).contiguous()
        if self.lib.dspark_decoder_layers(
                x.data_ptr(), n, self.ptrs.data_ptr(), len(self.ptrs), hidden, cfg.num_heads, kvh, d, inter, s,
                length, cos.data_ptr(), sin.data_ptr(), slots.data_ptr(), pos.data_ptr(),
                None if vis is None else vis.data_ptr(), cfg.rms_norm_eps,
                d ** -0.5, scratch.data_ptr(), taps.data_ptr(), cols.data_ptr(), ntaps, torch.get_num_threads(),
                self.kind):
            raise IndexError(f"attention: a slot or position is outside the cache ({s} slots, {length} positions)")
        return x, taps

    def context_kv(self, taps: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, token_slots: torch.Tensor,
                   positions: torch.Tensor) -> None:
        """A KV-injecting drafter's context: taps [N, tap width] (fp32, the target's
        tapped hidden states side by side) -> every layer's keys and values of
        hidden_norm(fc(taps)), written to the cache at (slot, position) per token.
        Needs a stack built with `fc` and `hidden_norm`."""
        fc, hn, width = self._context
        cfg = self.cfg
        n = taps.shape[0]
        s, kvh, length, d = cache.k[0].shape
        self._bind(cache)
        taps = taps.to(torch.float32).contiguous()
        if taps.shape[1] != width:
            raise ValueError(f"context_kv: taps have {taps.shape[1]} features, fc takes {width}")
        hidden = hn.shape[0]
        scratch = taps.new_empty(n * (2 * hidden + 2 * kvh * d))
        cos, sin = cos.contiguous(), sin.contiguous()
        slots = token_slots.to(torch.int64).contiguous()
        pos = positions.to(torch.int64).contiguous()
        if self.lib.dspark_drafter_context(
                taps.data_ptr(), n, width, fc.data_ptr(), hn.data_ptr(), self.ptrs.data_ptr(), len(self.ptrs),
                hidden, cfg.num_heads, kvh, d, s, length, cos.data_ptr(), sin.data_ptr(), slots.data_ptr(),
                pos.data_ptr(), cfg.rms_norm_eps, scratch.data_ptr(), torch.get_num_threads(), self.kind):
            raise IndexError(f"context_kv: a slot or position is outside the cache ({s} slots, {length} positions)")
