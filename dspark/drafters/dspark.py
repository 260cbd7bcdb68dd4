"""DSpark: a parallel block drafter with KV injection, a Markov head and a confidence
head. DFlash is the same model with `method="dflash"` (no heads).

Data flow of one `draft` call for request r with context length P:

    context feature of token p < P:  f_p = hidden_norm(fc(concat_i target_hidden_i[p]))
    (each layer's k/v projections of f_p sit in the request's KV slot, written once by
    `append_context`; a rollback only moves the slot's length)

    block  = [anchor at P, mask at P+1 .. P+block_size-1]
    every layer: queries = block, keys/values = [context 0..P-1 ; block], non-causal
    h_k    = norm(output at block slot k),  k = 1..num_tokens   (γ = block_size - 1)
             (with `sample_from_anchor`, DeepSpec's convention: slot k-1, γ = block_size)
    logits = lm_head(h_k) (+ Markov bias of the token drafted at k-1), over the draft
             vocabulary (the target's, or a reduced one mapped back through d2t)
    c_k    = confidence head (h_k, Markov latent)

The backbone runs once per call for all requests (one padded batch); only the cheap
Markov bias and the sampling go left to right (for the vanilla head over restricted
candidates, every row they can need is precomputed first: markov_walk.py). The block
always has its full `block_size`, also when fewer tokens are asked for, so that
position k sees what it saw in training.

Training (teacher forcing over whole sequences) reuses the same pieces:
`context_features` -> `context_kv` -> `run_backbone` with an explicit mask that lets
each block see the context before its anchor plus itself, then `norm` and
`head_outputs` with the true previous tokens.
"""

from __future__ import annotations

import torch
from torch import nn

from dspark.runtime.cpu_kernels import topk_rows
from dspark.runtime.model import RMSNorm
from dspark.runtime.native_stack import NativeStack
from dspark.runtime.weight_formats import linear_input_dtype

from .base import DraftOutput, DraftRequest, choose_tokens
from .config import DrafterConfig
from .heads import ConfidenceHead, MarkovHead
from .kv_drafter import KVDrafter
from .layers import DrafterLayer, attention_mask, gather_past
from .markov_walk import walk_vanilla
from .target_parts import TargetParts


class DSparkDrafter(KVDrafter):
    #: Drafting restricts the Markov head to this many candidates per position: the
    #: top tokens of the backbone logits. The bias W2·z is then computed for those
    #: tokens only, instead of a rank x vocab product per drafted token, the part of a
    #: draft that is memory-bound on a CPU. The drafted token is drawn from, and the
    #: returned logits are, the restricted distribution (-inf elsewhere), so the
    #: verifier sees exactly the q the token came from and decoding stays lossless;
    #: only a token that the Markov bias would lift from outside the candidates is no
    #: longer proposed. 0 = the full vocabulary (the training-time head).
    markov_candidates: int = 64

    def __init__(self, config: DrafterConfig, target: TargetParts) -> None:
        super().__init__(config, target)
        if config.method not in ("dspark", "dflash"):
            raise ValueError(f"DSparkDrafter builds dspark/dflash, not {config.method!r}")
        h = config.hidden_size
        t = target.cfg.hidden_size
        self.fc = nn.Linear(len(config.target_layer_ids) * t, h, bias=False)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.layers = nn.ModuleList(DrafterLayer(self.layer_config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.markov_head = (
            MarkovHead(config.vocab_size, h, config.markov_rank, config.markov_head_type, config.output_vocab_size)
            if config.has_markov_head else None
        )
        self.confidence_head = (
            ConfidenceHead(h, config.markov_rank if config.confidence_head_with_markov else 0, config.max_draft_tokens)
            if config.enable_confidence_head else None
        )

    # --- model pieces (shared by drafting and training) ------------------------------
    def context_features(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """[..., taps, target_hidden] -> injected context features [..., hidden]."""
        return self.hidden_norm(self.fc(target_hidden.flatten(-2).to(linear_input_dtype(self.fc))))

    def context_kv(
        self,
        features: torch.Tensor,  # [B, S, hidden]
        positions: torch.Tensor,  # [B, S] absolute positions of the context tokens
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, keys/values of context features: [B, kv_heads, S, head_dim] each."""
        cos, sin = self.rotary(positions, features.dtype)
        out = []
        for layer in self.layers:
            k, v = layer.project_context(features, cos, sin)
            out.append((k.transpose(1, 2), v.transpose(1, 2)))
        return out

    def block_token_ids(self, anchors: torch.Tensor) -> torch.Tensor:
        """[...] anchor tokens -> [..., block_size]: the anchor, then mask tokens."""
        masks = torch.full((*anchors.shape, self.config.block_size - 1), self.config.mask_token_id,
                           dtype=torch.long, device=anchors.device)
        return torch.cat([anchors.unsqueeze(-1).long(), masks], dim=-1)

    def run_backbone(
        self,
        x: torch.Tensor,  # [B, Q, hidden] block embeddings
        positions: torch.Tensor,  # [B, Q] absolute positions of the queries
        context_kv: list[tuple[torch.Tensor, torch.Tensor]],  # per layer [B, kv_heads, K, head_dim]
        mask: torch.Tensor | None,  # [B, 1, Q, K + Q] bool over [context keys, query keys]
    ) -> torch.Tensor:
        """The N layers: [B, Q, hidden] BEFORE the final `norm`. Every query attends to
        the context keys and the queries' own keys allowed by `mask` (None = all)."""
        cos, sin = self.rotary(positions, x.dtype)
        for layer, (ck, cv) in zip(self.layers, context_kv):
            x, _, _ = layer(x, cos, sin, ck, cv, mask)
        return x

    def run_backbone_blocks(
        self,
        x: torch.Tensor,  # [B, A*Q, hidden] embeddings of A blocks
        positions: torch.Tensor,  # [B, A*Q] absolute positions of the queries
        context_kv: list[tuple[torch.Tensor, torch.Tensor]],  # per layer [B, kv_heads, S, head_dim]
        ctx_mask: torch.Tensor,  # [B, A, S] bool: the context keys each block sees
    ) -> torch.Tensor:
        """`run_backbone` for training over many independent blocks: each block attends
        to its allowed context and to itself only. [B, A*Q, hidden] before `norm`."""
        cos, sin = self.rotary(positions, x.dtype)
        a = ctx_mask.shape[1]
        for layer, (ck, cv) in zip(self.layers, context_kv):
            x = layer.forward_blocks(x, cos, sin, ck, cv, ctx_mask, a)
        return x

    def head_outputs(
        self,
        hidden: torch.Tensor,  # [..., K, hidden] normed backbone output at block positions 1..K
        prev_tokens: torch.Tensor,  # [..., K] token at the previous block position (anchor first)
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher-forced (logits [..., K, draft vocab] fp32 incl. the Markov bias,
        confidence logits [..., K] before temperature, or None). `prev_tokens` are
        target ids."""
        logits = self.head_logits(hidden)
        latent = None
        if self.markov_head is not None:
            latent = self.markov_head.block_latents(prev_tokens, hidden)
            logits = logits + self.markov_head.bias(latent).float()
        conf = self.confidence_head.logit(hidden, latent) if self.confidence_head is not None else None
        return logits, conf

    def _native_backbone(self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                         lens: list[int]) -> torch.Tensor | None:
        """`run_backbone` over the pool in one native call (runtime/native_stack.py), for
        a bf16w drafter on a CPU; None where it does not apply. The block's keys and
        values are written to the slot past its context (the next `append_context`
        overwrites them) and every block query sees the context and the whole block."""
        stack = self._stack()
        q = x.shape[1]
        if stack is None or x.dtype != torch.float32 or max(lens) + q > self.pool.max_len:
            return None
        r, hidden = x.shape[0], x.shape[2]
        pos = positions.reshape(-1)
        cos, sin = self.rotary(pos, x.dtype)
        # per block token: its slot, and how much of the slot it sees (built in Python: a
        # repeat_interleave costs tens of microseconds)
        visible = torch.tensor([n + q for n in lens for _ in range(q)], dtype=torch.int64)
        token_slots = torch.tensor([s for s in slots.tolist() for _ in range(q)], dtype=torch.int64)
        out, _ = stack.run(x.reshape(r * q, hidden), cos, sin, self.pool, token_slots, pos, [], visible=visible)
        return out.view(r, q, hidden)

    def _stack(self) -> NativeStack | None:
        """The backbone's native stack, built on first use for the drafter's current
        weights (its linears become bf16w once, when an engine loads it)."""
        pool, weights = self.pool, self.layers[0].self_attn.q_proj.__dict__.get("forward")
        key = self.__dict__.get("_stack_key")
        if key is None or key[0] is not pool or key[1] is not weights:
            self._stack_key = (pool, weights)
            k = pool.k[0]
            ok = (self.dtype == torch.float32 and self.device.type == "cpu" and k.dtype == torch.float32
                  and k.is_contiguous())
            self._native_stack = (NativeStack.for_drafter_layers(self.layer_config, self.layers, self.fc,
                                                                 self.hidden_norm) if ok else None)
        return self._native_stack

    # --- drafter interface -----------------------------------------------------------
    def _truncate_slot(self, slot: int, length: int) -> None:
        self.pool.truncate(slot, length)

    @torch.inference_mode()
    def append_context(
        self,
        request_ids: list[object],
        tokens: list[list[int]],
        start_positions: list[int],
        hidden: torch.Tensor,
    ) -> None:
        _, token_slots, positions, hidden = self._claim_context(request_ids, tokens, start_positions, hidden)
        stack = self._stack() if token_slots.numel() else None
        if stack is not None:
            cos, sin = self.rotary(positions, torch.float32)
            stack.context_kv(hidden.flatten(-2), cos, sin, self.pool, token_slots, positions)
        elif token_slots.numel():
            feats = self.context_features(hidden)  # [N, hidden]
            cos, sin = self.rotary(positions, feats.dtype)
            for i, layer in enumerate(self.layers):
                k, v = layer.project_context(feats, cos, sin)  # [N, kv_heads, head_dim]
                self.pool.k[i][token_slots, :, positions] = k
                self.pool.v[i][token_slots, :, positions] = v
        for rid, toks, start in zip(request_ids, tokens, start_positions):
            slot = self.slot(rid)
            self.pool.lengths[slot] = self._context_len[slot] = start + len(toks)

    @torch.inference_mode()
    def draft(self, requests: list[DraftRequest], num_tokens: int,
              lookup: list[tuple[list[int], list[float]]] | None = None) -> DraftOutput:
        """`lookup` (hybrid drafting, needs the confidence head): per request, prompt-lookup
        tokens and their calibrated confidences. Position k takes the lookup token when
        every earlier position did and its confidence is at least the drafter's c_k
        (computed from tokens < k, before token k is drawn); its q is then a point mass.
        `num_lookup` of the output says how many leading tokens came from lookup."""
        slots = self._claim_draft(requests, num_tokens)
        dev, r, q = self.device, len(requests), self.config.block_size
        if r == 0:
            return _empty_output(num_tokens, self.target.cfg.vocab_size, self.confidence_head is not None, dev)
        if lookup is not None and self.confidence_head is None:
            raise ValueError("lookup proposals need the confidence head (method dspark)")
        lens = [self._context_len[s] for s in slots]
        anchors = torch.tensor([req.anchor_token for req in requests], dtype=torch.long, device=dev)  # [R]
        x = self.target.embed(self.block_token_ids(anchors), self.dtype)  # [R, Q, hidden]
        positions = torch.tensor(lens, device=dev).unsqueeze(1) + torch.arange(q, device=dev)  # [R, Q]
        slot_t = torch.tensor(slots, dtype=torch.long, device=dev)
        out = self._native_backbone(x, positions, slot_t, lens)
        if out is None:
            kmax = max(lens)
            context = [(gather_past(self.pool.k[i], slot_t, lens, kmax),
                        gather_past(self.pool.v[i], slot_t, lens, kmax)) for i in range(len(self.layers))]
            mask = attention_mask(lens, [q] * r, kmax, q, causal=False, device=dev)
            out = self.run_backbone(x, positions, context, mask)
        first = self.config.first_draft_slot
        h = self.norm(out[:, first : first + num_tokens])  # [R, n, hidden]
        base = self.head_logits(h)  # [R, n, draft vocab]
        mk = self.markov_head
        used = None  # [R, n]: the positions that take the lookup token (a prefix of each row)
        if lookup is not None:
            look_tok, look_conf = _lookup_tensors(lookup, num_tokens, dev)
            # Along the lookup prefix every earlier token is a lookup token, so the c_k
            # that decide it (from tokens < k) are known before anything is drawn: one
            # batched call, where a loop would pay a dozen small ops per position.
            if any(t for t, _ in lookup):
                look_prev = torch.cat([anchors.unsqueeze(1), look_tok[:, :-1]], dim=1)  # [R, n]
                c_look = self.confidence_head(h, mk.block_latents(look_prev, h) if mk is not None else None)
                used = (look_conf >= c_look).cumprod(dim=1).bool()
            else:  # no proposal at all (confidence -1 everywhere): the drafter's block alone
                used = torch.zeros(r, num_tokens, dtype=torch.bool, device=dev)

        look_used = (look_tok, used) if used is not None else None
        want_logits = self.greedy_logits or not all(req.params.greedy for req in requests)
        num_cand = self.markov_candidates
        if mk is not None and 0 < num_cand < base.shape[-1]:
            # The candidates' base logits, target ids and W2 rows for every position at once
            base_cand, cand = topk_rows(base, num_cand)  # [R, n, C] each, best first
            cand_target = self.to_target_ids(cand)  # [R, n, C]
            w2c = mk.markov_w2.weight[cand].to(mk.markov_w1.weight.dtype)  # [R, n, C, rank]
            if mk.kind == "vanilla":  # every row the draft can need, precomputed (markov_walk.py)
                out_tokens, step_logits = walk_vanilla(base_cand, cand_target, w2c, mk.markov_w1.weight, anchors,
                                                       requests, *(look_used or (None, None)))
                latents = mk.latent(torch.cat([anchors.unsqueeze(1), out_tokens[:, :-1]], dim=1), h)
            else:
                out_tokens, step_logits, latents = self._walk(h, base_cand, anchors, requests, look_used,
                                                              (cand_target, w2c))
            # the restricted distribution over the target vocabulary: -inf but at the candidates
            out_logits = None
            if want_logits:
                full = step_logits.new_full((r, num_tokens, self.config.vocab_size), float("-inf"))
                out_logits = full.scatter_(2, cand_target, step_logits)
        else:
            out_tokens, step_logits, latents = self._walk(h, base, anchors, requests, look_used)
            out_logits = self.to_target_logits(step_logits) if want_logits else None
        conf = None
        if self.confidence_head is not None:
            conf = self.confidence_head(h, latents)
        if lookup is None:
            return DraftOutput(out_tokens, out_logits, conf)
        # A lookup token's q is a point mass; its confidence is lookup's own.
        rows, ks = used.nonzero(as_tuple=True)
        if rows.numel() and out_logits is not None:
            out_logits = out_logits.clone() if out_logits is step_logits else out_logits
            out_logits[rows, ks] = float("-inf")
            out_logits[rows, ks, out_tokens[rows, ks]] = 0.0
        return DraftOutput(out_tokens, out_logits, torch.where(used, look_conf, conf), num_lookup=used.sum(1))

    def _walk(self, h: torch.Tensor, base: torch.Tensor, anchors: torch.Tensor, requests: list[DraftRequest],
              look_used: tuple[torch.Tensor, torch.Tensor] | None,
              restricted: tuple[torch.Tensor, torch.Tensor] | None = None,
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The left-to-right part of a draft, position by position (any Markov head, or
        none): (tokens [R, n] target ids, the logits each was chosen from [R, n, V'],
        Markov latents [R, n, rank] or None). `base` is over the draft vocabulary, or
        over the candidates when `restricted` = (their target ids, their W2 rows)."""
        mk = self.markov_head
        cand_target, w2c = restricted if restricted is not None else (None, None)
        tokens, logits, latents = [], [], []
        prev, latent = anchors, None
        for k in range(base.shape[1]):
            if mk is not None:
                latent = mk.latent(prev, h[:, k], latent)  # [R, rank]
                latents.append(latent)
                if restricted is not None:
                    bias = torch.bmm(w2c[:, k], latent.unsqueeze(-1)).squeeze(-1)  # [R, C]
                    step = base[:, k] + bias.float()  # over the candidates only
                    chosen = cand_target[:, k].gather(1, choose_tokens(step, requests).unsqueeze(1)).squeeze(1)
                else:
                    step = base[:, k] + mk.bias(latent).float()
                    chosen = self.to_target_ids(choose_tokens(step, requests))
            else:
                step = base[:, k]
                chosen = self.to_target_ids(choose_tokens(step, requests))
            prev = chosen if look_used is None else torch.where(look_used[1][:, k], look_used[0][:, k], chosen)
            tokens.append(prev)
            logits.append(step)
        return (torch.stack(tokens, dim=1), torch.stack(logits, dim=1),
                torch.stack(latents, dim=1) if latents else None)


def _lookup_tensors(lookup: list[tuple[list[int], list[float]]], num_tokens: int,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Lookup tokens [R, n] (0 where none) and confidences [R, n] (-1 where none, so
    that the drafter always wins there)."""
    toks = torch.zeros(len(lookup), num_tokens, dtype=torch.long)
    conf = torch.full((len(lookup), num_tokens), -1.0)
    for i, (t, c) in enumerate(lookup):
        m = min(len(t), len(c), num_tokens)
        if m:
            toks[i, :m] = torch.tensor(t[:m], dtype=torch.long)
            conf[i, :m] = torch.tensor(c[:m], dtype=torch.float32)
    return toks.to(device), conf.to(device)


def _empty_output(num_tokens: int, vocab: int, with_conf: bool, device: torch.device) -> DraftOutput:
    return DraftOutput(
        torch.zeros(0, num_tokens, dtype=torch.long, device=device),
        torch.zeros(0, num_tokens, vocab, device=device),
        torch.zeros(0, num_tokens, device=device) if with_conf else None,
    )
