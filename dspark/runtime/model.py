"""One causal-LM implementation for the Llama family.

`Transformer.forward` runs a flattened batch (`FlatBatch`) of tokens from many
requests: every token carries its request's KV slot and its absolute position, every
request attends only to its own cache. It returns logits for the rows asked for and
the hidden states of the tapped layers (index i = output of decoder layer i, -1 = the
embeddings), which the drafters consume. The runtime knows nothing of speculation.

Weights keep Hugging Face names at load time and are fused here (q/k/v into one
projection, gate/up into one) to cut the number of kernels a decode step launches.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention import GROUPED_MAX_QUERIES, attention
from .batch import FlatBatch
from . import cpu_kernels
from .config import ModelConfig
from .kv_cache import KVCachePool
from .native_stack import NativeStack
from .weight_formats import weight_kind


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _native_ok(x, self.weight):
            return cpu_kernels.rmsnorm_f32(x, self.weight, self.eps)
        # Normalise in fp32 and cast back before the weight, as the reference does.
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


def _native_ok(*tensors: torch.Tensor) -> bool:
    """Whether fp32 CPU inference can take the native kernels (cpu_kernels) for these."""
    return (all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
            and cpu_kernels.available())


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    sc = cfg.rope_scaling
    if not sc:
        return inv
    kind = sc.get("rope_type", sc.get("type"))
    if kind == "linear":
        return inv / sc["factor"]
    if kind == "llama3":
        factor, lo, hi = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
        old = sc["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        return torch.where(medium, smoothed, scaled)
    return inv


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.qkv_proj = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=False)
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,  # [N, hidden]
        cos: torch.Tensor,  # [N, head_dim]
        sin: torch.Tensor,  # [N, head_dim]
        k_cache: torch.Tensor,  # [slots, kv_heads, max_len, head_dim]
        v_cache: torch.Tensor,
        layout: "_AttnPlan",
    ) -> torch.Tensor:
        cfg = self.cfg
        n = x.shape[0]
        qkv = self.qkv_proj(self.input_layernorm(x))
        if cfg.qk_norm:
            qk, v = qkv.split([cfg.q_size + cfg.kv_size, cfg.kv_size], dim=-1)
            q, k = qk.view(n, cfg.num_heads + cfg.num_kv_heads, cfg.head_dim).split(
                [cfg.num_heads, cfg.num_kv_heads], dim=1)
            qkv = torch.cat([self.q_norm(q).reshape(n, -1), self.k_norm(k).reshape(n, -1), v], dim=-1)
        # One rotary application for queries and keys together (fewer kernels per step).
        if layout.native:
            cpu_kernels.rope_f32_(qkv, cfg.num_heads + cfg.num_kv_heads, cos, sin)
        else:
            qk, v = qkv.split([cfg.q_size + cfg.kv_size, cfg.kv_size], dim=-1)
            qk = qk.reshape(n, cfg.num_heads + cfg.num_kv_heads, cfg.head_dim)
            qk = qk * cos.unsqueeze(1) + rotate_half(qk) * sin.unsqueeze(1)
            qkv = torch.cat([qk.reshape(n, -1), v], dim=-1)
        o = layout.write_and_attend(qkv, k_cache, v_cache).reshape(n, cfg.q_size)
        x = x + self.o_proj(o)
        gate_up = self.gate_up_proj(self.post_attention_layernorm(x))
        if layout.native:
            h = cpu_kernels.silu_mul_f32(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            h = F.silu(gate) * up
        return x + self.down_proj(h)


class _AttnPlan:
    """How one forward's attention runs, shared by every layer.

    fp32 on a CPU with the native kernels: one kernel call per layer for all tokens
    (`cpu_kernels.attention_f32`). Otherwise, torch: requests are padded to the longest query of their group. A prefill next to
    decodes would pad every decode to the prompt's length (and push the whole batch
    off the grouped short-query path), so a batch that mixes short requests (at most
    GROUPED_MAX_QUERIES new tokens: decodes, verifications) with long ones (prefills)
    attends in two groups.
    """

    def __init__(self, batch: FlatBatch, device: torch.device, num_slots: int | None = None,
                 native: bool = False) -> None:
        lens = batch.seq_lens
        # built in Python: three small tensor operators cost a decode step tens of microseconds
        self.token_slots = torch.tensor([s for s, n in zip(batch.slots, lens) for _ in range(n)],
                                        dtype=torch.long, device=device)
        self.positions = batch.positions
        self.kv_len = max(batch.positions.tolist()) + 1
        # native: every token goes through the fp32 CPU kernel, which writes the cache
        # and attends straight from it (no padding, no mask), the same way for a token
        # whatever shares its step: prefill chunks, verifications and decodes agree bit
        # for bit with unbatched work.
        self.native = native
        if native:
            self.groups = []
            return
        short = [i for i, n in enumerate(lens) if n <= GROUPED_MAX_QUERIES]
        if not short or len(short) == len(lens):
            self.groups = [(None, _AttnLayout(batch, device, num_slots))]
        else:
            long = [i for i, n in enumerate(lens) if n > GROUPED_MAX_QUERIES]
            self.groups = [_sub_layout(batch, idx, device, num_slots) for idx in (short, long)]

    def write_and_attend(self, qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """qkv [N, (heads + 2 kv_heads) * head_dim] of the batch's tokens, rotary
        applied: store the keys and values in the cache, then attend. Returns the
        attention output [N, heads, head_dim]."""
        kvh, d = k_cache.shape[1], k_cache.shape[3]
        heads = qkv.shape[1] // d - 2 * kvh
        if self.native:
            return cpu_kernels.attention_f32(qkv, heads, k_cache, v_cache, self.token_slots, self.positions)
        q, k, v = qkv.view(qkv.shape[0], heads + 2 * kvh, d).split([heads, kvh, kvh], dim=1)
        k_cache[self.token_slots, :, self.positions] = k
        v_cache[self.token_slots, :, self.positions] = v
        return self.attend(q, k_cache, v_cache)

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """q [N, heads, head_dim] of the batch's tokens -> attention output, same shape."""
        if len(self.groups) == 1:
            return self.groups[0][1].attend(q, k_cache, v_cache)
        out = torch.empty_like(q)
        for rows, lay in self.groups:
            out[rows] = lay.attend(q.index_select(0, rows), k_cache, v_cache)
        return out


def _sub_layout(batch: FlatBatch, requests: list[int], device: torch.device,
                num_slots: int | None) -> tuple[torch.Tensor, "_AttnLayout"]:
    """The token rows of `requests` in `batch` and the layout of those requests alone."""
    cu = batch.cu_seqlens
    rows = torch.cat([torch.arange(cu[i], cu[i + 1], device=device) for i in requests])
    sub_cu = [0]
    for i in requests:
        sub_cu.append(sub_cu[-1] + cu[i + 1] - cu[i])
    sub = FlatBatch(batch.input_ids.index_select(0, rows), batch.positions.index_select(0, rows),
                    [batch.slots[i] for i in requests], sub_cu)
    return rows, _AttnLayout(sub, device, num_slots)


class _AttnLayout:
    """Index bookkeeping of one group of requests, shared by every layer.

    Requests in consecutive slots read their keys as a view of the cache. Otherwise
    the keys of the batch's slots must be gathered (a copy per layer) unless the
    batch holds at least half of all slots: then attention runs "slot-major" over
    every slot of the cache, a view again, with queries placed at their slot's row
    and unused slots attending to key 0 only (their output is dropped).
    """

    def __init__(self, batch: FlatBatch, device: torch.device, num_slots: int | None = None) -> None:
        lens = batch.seq_lens
        r = batch.num_requests
        self.qmax = max(lens)
        slots = torch.tensor(batch.slots, dtype=torch.long, device=device)
        lens_t = torch.tensor(lens, dtype=torch.long, device=device)
        req_of_token = torch.repeat_interleave(torch.arange(r, device=device), lens_t)
        token_slots = slots[req_of_token]
        cu = torch.tensor(batch.cu_seqlens[:-1], dtype=torch.long, device=device)
        offset_in_req = torch.arange(batch.input_ids.numel(), device=device) - cu[req_of_token]
        s0 = batch.slots[0]
        self.slot_range = (s0, s0 + r) if batch.slots == list(range(s0, s0 + r)) else None
        self.slot_major = self.slot_range is None and num_slots is not None and 2 * r >= num_slots
        if self.slot_major:
            self.r = num_slots
            self.flat_rows = token_slots * self.qmax + offset_in_req  # row in the padded [S*Qmax]
            self.padded = True
        else:
            self.r = r
            self.flat_rows = req_of_token * self.qmax + offset_in_req  # row in the padded [R*Qmax]
            self.padded = not all(n == self.qmax for n in lens)
        qpos = torch.zeros(self.r * self.qmax, dtype=torch.long, device=device)
        qpos[self.flat_rows] = batch.positions
        qpos = qpos.view(self.r, self.qmax)
        self.kv_len = max(batch.positions.tolist()) + 1
        key_idx = torch.arange(self.kv_len, device=device)
        mask = key_idx.view(1, 1, -1) <= qpos.unsqueeze(-1)  # [R, Qmax, L]
        # A single query that sees its whole (shared-length) context needs no mask.
        self.mask = None if bool(mask.all()) else mask.unsqueeze(1)
        self.slots = slots

    def gather(self, cache: torch.Tensor) -> torch.Tensor:
        if self.slot_major:
            return cache[:, :, : self.kv_len]
        if self.slot_range is not None:
            return cache[self.slot_range[0] : self.slot_range[1], :, : self.kv_len]
        return cache[:, :, : self.kv_len].index_select(0, self.slots)

    def pad_queries(self, q: torch.Tensor) -> torch.Tensor:
        n, h, d = q.shape
        if not self.padded:
            return q.view(self.r, self.qmax, h, d).transpose(1, 2)
        out = q.new_zeros(self.r * self.qmax, h, d)
        out[self.flat_rows] = q
        return out.view(self.r, self.qmax, h, d).transpose(1, 2)

    def unpad(self, o: torch.Tensor) -> torch.Tensor:
        r, h, qm, d = o.shape
        o = o.transpose(1, 2).reshape(r * qm, h, d)
        return o if not self.padded else o[self.flat_rows]

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """q [n, heads, head_dim] of this group's tokens -> attention output [n, heads, head_dim]."""
        o = attention(self.pad_queries(q), self.gather(k_cache), self.gather(v_cache), self.mask)
        return self.unpad(o)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, max_len: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self._rope_len = 0
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        # Not on the meta device (a loader's skeleton): meta arithmetic imports torch's
        # compiler stack, seconds of a start; the loader builds the tables on the real one.
        if not self.embed_tokens.weight.is_meta:
            self.ensure_rope(max_len or min(cfg.max_position_embeddings, 4096))

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype (activations, KV cache); weights may be stored narrower
        (`use_bf16_weights`)."""
        return self.norm.weight.dtype

    @property
    def precision(self) -> str:
        """bf16, fp16, fp32, bf16w (bf16 weights, fp32 compute), bf16x (bf16 weights,
        matmul inputs rounded to bf16, fp32 accumulation and everything else fp32) or
        gguf (a GGUF file's blocks as stored, fp32 compute) or q8x (the same blocks,
        int8 activations)."""
        if weight_kind(self.layers[0].qkv_proj) == "q":
            return "q8x" if self.layers[0].qkv_proj.forward.packed.int8_activations else "gguf"
        if self.embed_tokens.weight.dtype == torch.bfloat16 and self.dtype == torch.float32:
            return "bf16x" if weight_kind(self.layers[0].qkv_proj) == "bf16x" else "bf16w"
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(self.dtype, "fp32")

    def _native_attention(self, cache: KVCachePool) -> bool:
        """Whether attention takes the fp32 CPU kernel (kernels/attention_f32.c)."""
        return (self.device.type == "cpu" and self.dtype == torch.float32 and cache.k[0].dtype == torch.float32
                and self.cfg.head_dim % 8 == 0 and cache.k[0].is_contiguous() and _native_ok(self.norm.weight))

    def _stack(self) -> NativeStack | None:
        """The decoder layers in one native call, for a model on a CPU whose linears run
        native kernels (bf16w, bf16x, fp32 as f32w; built on first use, after the
        linears were switched at load)."""
        key = (self.precision, self.device.type)
        if self.__dict__.get("_stack_key") != key:
            self._stack_key = key
            # fp32 activations on a CPU; whether the linears are native, for_layers decides
            self._native_stack = (NativeStack.for_layers(self.layers) if key[1] == "cpu"
                                  and self.dtype == torch.float32 else None)
        return self._native_stack

    def ensure_rope(self, length: int) -> None:
        if length <= self._rope_len:
            return
        inv = rope_inv_freq(self.cfg).to(self.embed_tokens.weight.device)
        t = torch.arange(length, dtype=torch.float32, device=inv.device)
        freqs = torch.outer(t, inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.rope_cos = emb.cos()
        self.rope_sin = emb.sin()
        self._rope_len = length

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids).to(self.dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head on already-selected rows of the last layer's output."""
        return self.lm_head(self.norm(hidden))

    @torch.inference_mode()
    def forward(
        self,
        batch: FlatBatch,
        cache: KVCachePool,
        hidden_layers: list[int] | tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run one step. Returns (logits [num_logit_rows, vocab] in fp32,
        hidden [num_tokens, len(hidden_layers), hidden] or None)."""
        pos = batch.positions.tolist()
        for s, a, b in zip(batch.slots, batch.cu_seqlens, batch.cu_seqlens[1:]):
            first = pos[a]
            if first > cache.lengths[s]:
                raise ValueError(f"slot {s}: position {first} skips past the cache length {cache.lengths[s]}")
            cache.check_room(s, first + (b - a) - cache.lengths[s])
        self.ensure_rope(cache.max_len)
        layout = _AttnPlan(batch, self.device, cache.num_slots, native=self._native_attention(cache))
        if not layout.native:  # the native kernel never reads past a slot's length
            cache.ensure_initialized(layout.kv_len)
        x = self.embed(batch.input_ids)
        dtype = x.dtype
        cos = self.rope_cos[batch.positions].to(dtype)
        sin = self.rope_sin[batch.positions].to(dtype)
        taps: dict[int, torch.Tensor] = {}
        ready = None
        wanted = set(hidden_layers)
        if -1 in wanted:
            taps[-1] = x
        stack = self._stack() if layout.native else None
        if stack is not None and len(wanted) == len(hidden_layers):
            inner = [i for i in hidden_layers if i >= 0]
            x, stacked = stack.run(x, cos, sin, cache, layout.token_slots, layout.positions, inner)
            if len(inner) == len(hidden_layers):  # no embeddings among the taps: already stacked
                hidden_layers, ready = (), stacked
            else:
                taps.update((i, stacked[:, c]) for c, i in enumerate(inner))
        else:
            for i, layer in enumerate(self.layers):
                x = layer(x, cos, sin, cache.k[i], cache.v[i], layout)
                if i in wanted:
                    taps[i] = x
        for s, a, b in zip(batch.slots, batch.cu_seqlens, batch.cu_seqlens[1:]):
            cache.lengths[s] = pos[b - 1] + 1
        rows = x if batch.logit_rows is None else x.index_select(0, batch.logit_rows)
        logits = self.logits(rows).float() if rows.shape[0] else rows.new_zeros(0, self.cfg.vocab_size).float()
        hidden = torch.stack([taps[i] for i in hidden_layers], dim=1) if hidden_layers else ready
        return logits, hidden
