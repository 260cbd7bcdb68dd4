"""The one decoder layer every drafter stacks, rotary embedding at absolute positions,
and the attention-mask and KV-gather helpers the drafters share.

`DrafterLayer.forward` attends from a padded batch of queries to an explicit key set:
keys/values given by the caller (a request's context, or anything a training step
builds) followed by the queries' own keys, under an explicit boolean mask. That one
call serves DSpark's non-causal block, the autoregressive drafters' causal steps, and
teacher-forced training over many blocks at once. Parameter names follow the Hugging
Face layout (`self_attn.q_proj`, `mlp.gate_proj`, ...) so checkpoints load as is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dspark.runtime.attention import attention
from dspark.runtime.config import ModelConfig
from dspark.runtime.model import RMSNorm, rope_inv_freq, rotate_half


class Rotary:
    """cos/sin of rotary embedding for arbitrary absolute positions, in fp32 (the same
    product as the runtime's table; not a module, so casting the drafter to bf16 never
    rounds the frequencies). Read from a table of every position up to the largest
    asked for so far (grown in powers of two): a draft asks twice a step, and four
    small operators a call cost more than one gather."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg
        self._tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _table(self, device: torch.device, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        table = self._tables.get(device)
        if table is None or table[0].shape[0] < size:
            n = 1 << max(10, (size - 1).bit_length())
            freqs = torch.arange(n, device=device).unsqueeze(-1).float() * rope_inv_freq(self.cfg).to(device)
            emb = torch.cat((freqs, freqs), dim=-1)  # [n, head_dim]
            table = self._tables[device] = (emb.cos(), emb.sin())
        return table

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.numel() == 0:
            shape = (*positions.shape, self.cfg.head_dim)
            return (torch.empty(shape, dtype=dtype, device=positions.device),) * 2
        cos, sin = self._table(positions.device, int(positions.max()) + 1)
        return cos[positions].to(dtype), sin[positions].to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., heads, head_dim]; cos/sin [..., head_dim] (broadcast over heads)."""
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, input_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.q_proj = nn.Linear(input_size, cfg.q_size, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(input_size, cfg.kv_size, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(input_size, cfg.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def project_kv(
        self,
        x: torch.Tensor,  # [..., input_size]
        cos: torch.Tensor,  # [..., head_dim]
        sin: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (k-norm, then rope) and values: [..., kv_heads, head_dim] each."""
        cfg = self.cfg
        k = self.k_proj(x).unflatten(-1, (cfg.num_kv_heads, cfg.head_dim))
        v = self.v_proj(x).unflatten(-1, (cfg.num_kv_heads, cfg.head_dim))
        if cfg.qk_norm:
            k = self.k_norm(k)
        return apply_rope(k, cos, sin), v

    def forward(
        self,
        x: torch.Tensor,  # [B, Q, input_size]
        cos: torch.Tensor,  # [B, Q, head_dim]
        sin: torch.Tensor,
        past_k: torch.Tensor | None,  # [B, kv_heads, K, head_dim]
        past_v: torch.Tensor | None,
        mask: torch.Tensor | None,  # [B, 1, Q, K + Q] bool, True = may attend
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self._qkv(x, cos, sin)
        keys = k if past_k is None else torch.cat([past_k, k], dim=2)
        values = v if past_v is None else torch.cat([past_v, v], dim=2)
        o = attention(q, keys, values, mask)
        o = o.transpose(1, 2).flatten(2)  # [B, Q, q_size]
        return self.o_proj(o), k, v

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Queries [B, heads, Q, hd], keys and values [B, kv_heads, Q, hd]."""
        cfg = self.cfg
        q = self.q_proj(x).unflatten(-1, (cfg.num_heads, cfg.head_dim))  # [B, Q, heads, hd]
        if cfg.qk_norm:
            q = self.q_norm(q)
        q = apply_rope(q, cos, sin).transpose(1, 2)
        k, v = self.project_kv(x, cos, sin)
        return q, k.transpose(1, 2), v.transpose(1, 2)

    def forward_blocks(
        self,
        x: torch.Tensor,  # [B, A*Q, input_size]: A blocks of Q queries each
        cos: torch.Tensor,  # [B, A*Q, head_dim]
        sin: torch.Tensor,
        ctx_k: torch.Tensor,  # [B, kv_heads, S, head_dim] context keys shared by the blocks
        ctx_v: torch.Tensor,
        ctx_mask: torch.Tensor,  # [B, A, S] bool: the context keys block a may see
        num_blocks: int,
    ) -> torch.Tensor:
        """Training attention of many blocks: each block sees the context keys its mask
        allows and its own Q keys, never another block's. The same result as `forward`
        with a block-diagonal mask over all blocks' keys, without scoring the A*Q x A*Q
        pairs that mask throws away (a block needs Q x Q of them)."""
        cfg = self.cfg
        q, k, v = self._qkv(x, cos, sin)
        b, kvh, d, a = q.shape[0], cfg.num_kv_heads, cfg.head_dim, num_blocks
        g, nq, s = cfg.num_heads // kvh, x.shape[1] // num_blocks, ctx_k.shape[2]
        qg = (q * d**-0.5).reshape(b, kvh, g, a, nq, d)
        kb, vb = k.reshape(b, kvh, a, nq, d), v.reshape(b, kvh, a, nq, d)
        s_ctx = torch.matmul(qg.reshape(b, kvh, g * a * nq, d), ctx_k.transpose(-1, -2))
        s_ctx = s_ctx.view(b, kvh, g, a, nq, s).masked_fill(~ctx_mask.view(b, 1, 1, a, 1, s), float("-inf"))
        s_own = torch.matmul(qg.transpose(2, 3), kb.unsqueeze(3).transpose(-1, -2))  # [B, kvh, A, g, Q, Q]
        scores = torch.cat([s_ctx, s_own.transpose(2, 3)], dim=-1).float()  # [B, kvh, g, A, Q, S+Q]
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        p_ctx, p_own = probs.split([s, nq], dim=-1)
        o = torch.matmul(p_ctx.reshape(b, kvh, g * a * nq, s), ctx_v).view(b, kvh, g, a, nq, d)
        o = o + torch.matmul(p_own.transpose(2, 3), vb.unsqueeze(3)).transpose(2, 3)
        o = o.reshape(b, cfg.num_heads, a * nq, d).transpose(1, 2).flatten(2)  # [B, A*Q, q_size]
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DrafterLayer(nn.Module):
    """Pre-norm decoder layer (attention + SwiGLU MLP) over an explicit key set.

    `attn_input_size` widens the q/k/v input (Eagle3 feeds [embedding ; feature], 2H).
    """

    def __init__(self, cfg: ModelConfig, attn_input_size: int | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, attn_input_size or cfg.hidden_size)
        self.mlp = MLP(cfg)

    def project_context(
        self, features: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's keys/values of injected context features [..., hidden] (already
        normalised by the drafter's `hidden_norm`, so no input_layernorm here):
        [..., kv_heads, head_dim] each."""
        return self.self_attn.project_kv(features, cos, sin)

    def forward(
        self,
        x: torch.Tensor,  # [B, Q, hidden] residual stream at the query positions
        cos: torch.Tensor,  # [B, Q, head_dim] rope at the query positions
        sin: torch.Tensor,
        past_k: torch.Tensor | None,  # [B, kv_heads, K, head_dim] keys placed before the queries' own
        past_v: torch.Tensor | None,
        mask: torch.Tensor | None,  # [B, 1, Q, K + Q] bool over [past keys, own keys]; None = all
        attn_input: torch.Tensor | None = None,  # [B, Q, in]: replaces input_layernorm(x) as q/k/v input
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns (output [B, Q, hidden], own keys, own values [B, kv_heads, Q, head_dim]),
        the keys already normed and rotated, ready for a KV cache."""
        h = self.input_layernorm(x) if attn_input is None else attn_input
        a, k, v = self.self_attn(h, cos, sin, past_k, past_v, mask)
        x = x + a
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, k, v

    def forward_blocks(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx_k: torch.Tensor,
                       ctx_v: torch.Tensor, ctx_mask: torch.Tensor, num_blocks: int) -> torch.Tensor:
        """`forward` for A independent blocks over shared context keys (training; see
        `Attention.forward_blocks`): [B, A*Q, hidden] -> [B, A*Q, hidden]."""
        x = x + self.self_attn.forward_blocks(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, ctx_mask, num_blocks)
        return x + self.mlp(self.post_attention_layernorm(x))


def attention_mask(
    past_lens: list[int],
    query_lens: list[int],
    num_past: int,
    num_queries: int,
    causal: bool,
    device: torch.device,
) -> torch.Tensor | None:
    """Mask [B, 1, num_queries, num_past + num_queries] for a padded batch.

    Request b sees its first `past_lens[b]` past keys and its own `query_lens[b]` keys
    (all of them, or those at or before the query when `causal`). Padding query rows
    see their request's own keys so no row is empty; their outputs are discarded.
    None when nothing needs masking.
    """
    lens_full = all(n == num_past for n in past_lens) and all(n == num_queries for n in query_lens)
    if lens_full and (not causal or num_queries == 1):
        return None
    past = torch.tensor(past_lens, device=device)
    own = torch.tensor(query_lens, device=device)
    kp = torch.arange(num_past, device=device)
    ko = torch.arange(num_queries, device=device)
    past_ok = (kp.view(1, 1, -1) < past.view(-1, 1, 1)).expand(-1, num_queries, -1)  # [B, Q, K]
    own_ok = (ko.view(1, 1, -1) < own.view(-1, 1, 1)).expand(-1, num_queries, -1)  # [B, Q, Q]
    if causal:
        qi = ko.view(1, -1, 1)
        real_query = qi < own.view(-1, 1, 1)
        own_ok = own_ok & ((ko.view(1, 1, -1) <= qi) | ~real_query)
    return torch.cat([past_ok, own_ok], dim=-1).unsqueeze(1)


def gather_past(
    cache: torch.Tensor,  # [slots, kv_heads, max_len, head_dim]
    slots: torch.Tensor,  # [B] int64
    lens: list[int],
    num_past: int,
) -> torch.Tensor:
    """The first `num_past` cache entries of each slot: [B, kv_heads, num_past, head_dim].

    Entries past a request's own length are zeroed: the pool is allocated with
    `torch.empty`, and a NaN there would survive a zero attention weight."""
    out = cache[:, :, :num_past].index_select(0, slots)
    if any(n < num_past for n in lens):
        valid = torch.arange(num_past, device=out.device).view(1, -1) < torch.tensor(lens, device=out.device).view(-1, 1)
        out = out.masked_fill(~valid.view(len(lens), 1, num_past, 1), 0)
    return out
