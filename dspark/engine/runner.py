"""One engine step: draft, choose verification lengths, verify in ONE target forward.

The target forward of a step carries, flattened, every running request's
[anchor, d_1..d_L] (its verification) and every newly admitted request's prompt
(its prefill). Prefill rows produce one sampled token (L = 0), verification rows go
through the rejection sampler; both through the same `rejection_sample` call, so a
request's randomness comes only from its own generator.
"""

from __future__ import annotations

import torch

from dspark.drafters.base import DraftRequest, Drafter
from dspark.runtime.batch import FlatBatch
from dspark.runtime.kv_cache import KVCachePool
from dspark.runtime.model import Transformer
from dspark.schedule.policies import VerifyLengthPolicy
from dspark.verify import rejection_sample

from .sequence import Sequence


class SpecRunner:
    def __init__(
        self,
        model: Transformer,
        cache: KVCachePool,
        drafter: Drafter | None,
        policy: VerifyLengthPolicy,
        num_speculative_tokens: int,
    ) -> None:
        self.model = model
        self.cache = cache
        self.drafter = drafter
        self.policy = policy
        self.num_spec = min(num_speculative_tokens, drafter.max_draft_tokens) if drafter else 0
        self.hidden_layers = list(drafter.target_layer_ids) if drafter else []
        self.device = model.device
        #: the shape of the last step's work: tokens in its target forward, requests drafted for
        self.last_forward_tokens = 0
        self.last_drafted_requests = 0

    # --- lifecycle -------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.slot = self.cache.allocate(seq.request_id)
        seq.generator = torch.Generator(device=self.device)
        seq.generator.manual_seed(seq.params.seed if seq.params.seed is not None else int(torch.seed() % 2**63))
        if self.drafter is not None:
            self.drafter.add_request(seq.request_id)

    def release(self, seq: Sequence) -> None:
        if seq.slot >= 0:
            self.cache.release(seq.request_id)
            seq.slot = -1
            if self.drafter is not None:
                self.drafter.release(seq.request_id)

    # --- one step --------------------------------------------------------------
    def _verify_lengths(self, decodes: list[Sequence]) -> tuple[list[int], torch.Tensor | None, torch.Tensor | None]:
        if not decodes or self.num_spec == 0 or not self.policy.should_draft(len(decodes), self.num_spec):
            return [0] * len(decodes), None, None
        out = self.drafter.draft(
            [DraftRequest(s.request_id, s.anchor, s.num_cached, s.params, s.generator) for s in decodes],
            self.num_spec,
        )
        g = out.tokens.shape[1]
        if out.confidence is not None:
            survival = torch.cumprod(out.confidence.float(), dim=1)  # [R, G]
        else:
            survival = torch.ones(len(decodes), g)
        lengths = self.policy.choose(survival)
        valid = getattr(out, "num_valid", None)
        caps = []
        for i, s in enumerate(decodes):
            cap = min(g, s.params.max_tokens - len(s.output_ids) - 1, self.cache.max_len - s.num_cached - 1)
            if valid is not None:
                cap = min(cap, int(valid[i]))
            caps.append(max(cap, 0))
        # Caps depend only on lengths known before drafting, so clamping stays lossless.
        lengths = [min(int(L), c) for L, c in zip(lengths, caps)]
        return lengths, out.tokens, out.logits

    @torch.inference_mode()
    def step(self, prefills: list[Sequence], decodes: list[Sequence]) -> dict[object, list[int]]:
        """Advance every sequence by one round; returns request_id -> emitted tokens."""
        lengths, draft_tokens, draft_logits = self._verify_lengths(decodes)
        tokens: list[list[int]] = []
        starts: list[int] = []
        slots: list[int] = []
        logit_rows: list[int] = []
        row = 0
        drafted = draft_tokens.tolist() if draft_tokens is not None else None
        for i, (s, L) in enumerate(zip(decodes, lengths)):
            toks = [s.anchor] + (drafted[i][:L] if L else [])
            tokens.append(toks)
            starts.append(s.num_cached)
            slots.append(s.slot)
            logit_rows.extend(range(row, row + L + 1))
            row += L + 1
        for s in prefills:
            tokens.append(list(s.prompt_ids))
            starts.append(0)
            slots.append(s.slot)
            row += len(s.prompt_ids)
            logit_rows.append(row - 1)
        if not tokens:
            return {}
        self.last_forward_tokens = row
        self.last_drafted_requests = len(decodes) if draft_tokens is not None else 0
        batch = FlatBatch.from_requests(tokens, starts, slots, logits="none", device=self.device)
        batch.logit_rows = torch.tensor(logit_rows, dtype=torch.long, device=self.device)
        logits, hidden = self.model(batch, self.cache, self.hidden_layers)

        seqs = decodes + prefills
        all_lengths = lengths + [0] * len(prefills)
        cu = [0]
        for L in all_lengths:
            cu.append(cu[-1] + L)
        if cu[-1]:
            rows = [i for i, L in enumerate(lengths) for _ in range(L)]
            ks = [k for L in lengths for k in range(L)]
            d_tok = draft_tokens[rows, ks]
            d_log = draft_logits[rows, ks] if draft_logits is not None else None
        else:
            d_tok = torch.zeros(0, dtype=torch.long)
            d_log = None
        result = rejection_sample(logits, d_tok.to(self.device), None if d_log is None else d_log.to(self.device),
                                  cu, [s.params for s in seqs], [s.generator for s in seqs])

        if self.drafter is not None and lengths:
            self.drafter.record_verification([s.request_id for s in decodes], lengths,
                                             result.num_accepted[: len(decodes)])
        emitted: dict[object, list[int]] = {}
        ctx_ids, ctx_tokens, ctx_starts, ctx_rows = [], [], [], []
        for i, s in enumerate(seqs):
            a = result.num_accepted[i]
            out = result.output_tokens[i]
            first = batch.cu_seqlens[i]
            if i < len(decodes):
                kept = tokens[i][: a + 1]  # anchor + accepted drafts now have target states
                self.cache.truncate(s.slot, s.num_cached + a + 1)
                ctx_starts.append(s.num_cached)
                s.num_cached += a + 1
                s.stats.record(all_lengths[i], a)
            else:
                kept = tokens[i]
                ctx_starts.append(0)
                s.num_cached = len(kept)
            ctx_ids.append(s.request_id)
            ctx_tokens.append(kept)
            ctx_rows.extend(range(first, first + len(kept)))
            s.anchor = out[-1]
            emitted[s.request_id] = out
        if self.drafter is not None:
            h = hidden.index_select(0, torch.tensor(ctx_rows, device=self.device)) if hidden is not None else None
            self.drafter.append_context(ctx_ids, ctx_tokens, ctx_starts, h)
        return emitted
