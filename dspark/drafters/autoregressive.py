"""Autoregressive drafters: Eagle3 and MTP-1.

Both run a small causal stack over PAIRS: the entry at position j fuses the feature
of token j (from the target's hidden states) with the embedding of token j+1, and its
output predicts token j+2. So for a context of P tokens (0..P-1) and the anchor at P:

    cached pairs   (f_0, t_1) .. (f_{P-2}, t_{P-1})    at positions 0..P-2
    draft step 1   (f_{P-1}, anchor)                   at position P-1 -> predicts P+1
    draft step i   (h_{i-1}, d_{i-1})                  at position P+i-2 -> predicts P+i
                   (h_{i-1}: the drafter's own output hidden of step i-1, before `norm`)

The feature of the newest context token waits for its next token (the anchor, or the
first token of the next `append_context`), so each slot also keeps the features of
its context tokens (`_features`), which a rollback to any length can fall back on.
Drafted entries are truncated from the KV slot at the end of every `draft`.

Eagle3: feature f_j = fc(concat of the tapped target layers at j) (low/mid/high layers
by default); one decoder layer whose q/k/v read [input_layernorm(embedding) ;
hidden_norm(feature)] (2H) and whose residual stream starts at the feature.
MTP-1 (DeepSeek-style): feature = the target's last-layer output at j;
x = fc([embed_norm(embedding) ; hidden_norm(feature)]) (2H -> H), then the decoder
layer(s); drafts exactly one token per round.
Both end in the drafter's own `norm` (a fresh drafter copies the target's final norm
into it, so it starts as the shared one but can be trained) and the target's LM head.

Training (e.g. Eagle3's training-time test) can call `context_features` and `step`
directly: `step` takes explicit past keys/values and an explicit mask.
"""

from __future__ import annotations

import torch
from torch import nn

from dspark.runtime.model import RMSNorm
from dspark.runtime.weight_formats import linear_input_dtype

from .base import DraftOutput, DraftRequest, choose_tokens
from .config import DrafterConfig
from .kv_drafter import KVDrafter
from .layers import DrafterLayer, attention_mask, gather_past
from .target_parts import TargetParts

KV = list[tuple[torch.Tensor, torch.Tensor]]


class AutoregressiveDrafter(KVDrafter):
    def __init__(self, config: DrafterConfig, target: TargetParts) -> None:
        super().__init__(config, target)
        self._features: torch.Tensor | None = None  # [slots, max_len, hidden]

    # --- per-model pieces ----------------------------------------------------------
    def context_features(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """[..., taps, target_hidden] -> the feature stored per context token [..., hidden]."""
        raise NotImplementedError

    def step(
        self,
        features: torch.Tensor,  # [B, Q, hidden] feature of token j
        tokens: torch.Tensor,  # [B, Q] token j+1
        positions: torch.Tensor,  # [B, Q] j
        past: KV,  # per layer [B, kv_heads, K, head_dim]
        mask: torch.Tensor | None,  # [B, 1, Q, K + Q]
    ) -> tuple[torch.Tensor, KV]:
        """Output hidden before `norm` [B, Q, hidden] and the pairs' own keys/values per layer."""
        raise NotImplementedError

    # --- memory --------------------------------------------------------------------
    def _reserve_extra(self, num_slots: int, max_len: int) -> None:
        self._features = torch.empty(num_slots, max_len, self.config.hidden_size, dtype=self.dtype, device=self.device)

    def _truncate_slot(self, slot: int, length: int) -> None:
        self.pool.truncate(slot, max(length - 1, 0))

    def _run_pairs(
        self,
        slots: list[int],
        features: torch.Tensor,  # [B, Q, hidden]
        tokens: torch.Tensor,  # [B, Q]
        query_lens: list[int],  # real pairs per row (the rest is padding)
    ) -> torch.Tensor:
        """Run pairs that continue each slot's cache, write their keys/values, return the
        output hidden [B, Q, hidden]."""
        pool, dev = self.pool, self.device
        lens = [pool.lengths[s] for s in slots]
        b, q = tokens.shape
        positions = torch.tensor(lens, device=dev).unsqueeze(1) + torch.arange(q, device=dev)  # [B, Q]
        slot_t = torch.tensor(slots, dtype=torch.long, device=dev)
        kmax = max(lens)
        past = [(gather_past(pool.k[i], slot_t, lens, kmax), gather_past(pool.v[i], slot_t, lens, kmax))
                for i in range(len(pool.k))]
        mask = attention_mask(lens, query_lens, kmax, q, causal=True, device=dev)
        h, kv = self.step(features, tokens, positions, past, mask)
        valid = torch.arange(q, device=dev).unsqueeze(0) < torch.tensor(query_lens, device=dev).unsqueeze(1)  # [B, Q]
        rows = slot_t.unsqueeze(1).expand(b, q)[valid]
        cols = positions[valid]
        for i, (k, v) in enumerate(kv):
            pool.k[i][rows, :, cols] = k.transpose(1, 2)[valid]
            pool.v[i][rows, :, cols] = v.transpose(1, 2)[valid]
        for s, n, m in zip(slots, lens, query_lens):
            pool.lengths[s] = n + m
        return h

    # --- drafter interface -----------------------------------------------------------
    @torch.inference_mode()
    def append_context(
        self,
        request_ids: list[object],
        tokens: list[list[int]],
        start_positions: list[int],
        hidden: torch.Tensor,
    ) -> None:
        slots, token_slots, positions, hidden = self._claim_context(request_ids, tokens, start_positions, hidden)
        if token_slots.numel():
            self._features[token_slots, positions] = self.context_features(hidden)
        # Complete pairs (f_j, t_{j+1}) for j = first uncached .. end - 2.
        rows = []
        for slot, toks, start in zip(slots, tokens, start_positions):
            end = start + len(toks)
            first = self.pool.lengths[slot]
            if end - 1 > first:
                rows.append((slot, first, [toks[j + 1 - start] for j in range(first, end - 1)]))
            self._context_len[slot] = end
        if not rows:
            return
        q = max(len(t) for _, _, t in rows)
        dev = self.device
        feats = torch.zeros(len(rows), q, self.config.hidden_size, dtype=self.dtype, device=dev)
        toks_t = torch.zeros(len(rows), q, dtype=torch.long, device=dev)
        for b, (slot, first, toks) in enumerate(rows):
            feats[b, : len(toks)] = self._features[slot, first : first + len(toks)]
            toks_t[b, : len(toks)] = torch.tensor(toks, device=dev)
        self._run_pairs([r[0] for r in rows], feats, toks_t, [len(r[2]) for r in rows])

    @torch.inference_mode()
    def draft(self, requests: list[DraftRequest], num_tokens: int) -> DraftOutput:
        slots = self._claim_draft(requests, num_tokens)
        dev = self.device
        vocab = self.target.cfg.vocab_size
        if not requests:
            return DraftOutput(torch.zeros(0, num_tokens, dtype=torch.long, device=dev),
                               torch.zeros(0, num_tokens, vocab, device=dev))
        for req, slot in zip(requests, slots):
            if self._context_len[slot] == 0:
                raise ValueError(f"request {req.request_id!r}: {self.method} needs at least one context token to draft")
            self.pool.check_room(slot, num_tokens)
        last = torch.tensor([self._context_len[s] - 1 for s in slots], dtype=torch.long, device=dev)
        slot_t = torch.tensor(slots, dtype=torch.long, device=dev)
        feat = self._features[slot_t, last]  # [R, hidden]
        tok = torch.tensor([req.anchor_token for req in requests], dtype=torch.long, device=dev)
        committed = [self.pool.lengths[s] for s in slots]
        tokens, logits = [], []
        try:
            for _ in range(num_tokens):
                h = self._run_pairs(slots, feat.unsqueeze(1), tok.unsqueeze(1), [1] * len(slots))[:, 0]  # [R, hidden]
                step_logits = self.head_logits(self.norm(h))  # [R, draft vocab]
                tok = self.to_target_ids(choose_tokens(step_logits, requests))
                feat = h
                tokens.append(tok)
                logits.append(step_logits)
        finally:
            for s, n in zip(slots, committed):
                self.pool.truncate(s, n)
        return DraftOutput(torch.stack(tokens, dim=1), self.to_target_logits(torch.stack(logits, dim=1)))


class Eagle3Drafter(AutoregressiveDrafter):
    def __init__(self, config: DrafterConfig, target: TargetParts) -> None:
        super().__init__(config, target)
        h = config.hidden_size
        self.fc = nn.Linear(len(config.target_layer_ids) * target.cfg.hidden_size, h, bias=False)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.layers = nn.ModuleList([DrafterLayer(self.layer_config, attn_input_size=2 * h)])
        self.norm = RMSNorm(h, config.rms_norm_eps)

    def context_features(self, target_hidden: torch.Tensor) -> torch.Tensor:
        return self.fc(target_hidden.flatten(-2).to(linear_input_dtype(self.fc)))

    def step(self, features, tokens, positions, past, mask):
        layer = self.layers[0]
        emb = self.target.embed(tokens, features.dtype)
        attn_input = torch.cat([layer.input_layernorm(emb), self.hidden_norm(features)], dim=-1)  # [B, Q, 2H]
        cos, sin = self.rotary(positions, features.dtype)
        h, k, v = layer(features, cos, sin, past[0][0], past[0][1], mask, attn_input=attn_input)
        return h, [(k, v)]


class MTPDrafter(AutoregressiveDrafter):
    def __init__(self, config: DrafterConfig, target: TargetParts) -> None:
        super().__init__(config, target)
        h = config.hidden_size
        self.embed_norm = RMSNorm(h, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList(DrafterLayer(self.layer_config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(h, config.rms_norm_eps)

    def context_features(self, target_hidden: torch.Tensor) -> torch.Tensor:
        return target_hidden[..., 0, :].to(self.dtype)

    def step(self, features, tokens, positions, past, mask):
        emb = self.target.embed(tokens, features.dtype)
        x = self.fc(torch.cat([self.embed_norm(emb), self.hidden_norm(features)], dim=-1))  # [B, Q, H]
        cos, sin = self.rotary(positions, features.dtype)
        kv = []
        for layer, (pk, pv) in zip(self.layers, past):
            x, k, v = layer(x, cos, sin, pk, pv, mask)
            kv.append((k, v))
        return x, kv
