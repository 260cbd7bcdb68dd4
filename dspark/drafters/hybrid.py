"""The hybrid drafter: prompt lookup and a DSpark block under one scheduler.

Per request and position k, left to right, the proposal with the higher calibrated
confidence: the lookup token while lookup is ahead and has not been passed over yet,
then the DSpark drafter (whose Markov head conditions on the lookup tokens chosen
before it). The choice at k uses only what is known before token k is drawn (the
lookup match and the drafter's c_k, a function of tokens < k), and a lookup token is
recorded with its exact draft distribution, a point mass, so verification stays
lossless. A request whose lookup proposal fills the whole block at confidences no
lower than the drafter's recent average skips the drafter.

Trust. The calibration table is fitted once, on one set of replies, and shared by all
requests; but whether lookup works is a property of the text: a reply that copies
code from its prompt accepts nearly every lookup token, an essay almost none. So the
table's confidences are scaled twice, each time by (accepted + prior) / (predicted +
prior) over decayed sums of verified lookup tokens: once for the workload (all
requests, about the last 200 tokens), once per request against the workload-scaled
prediction (about its last 10 tokens; drifting back to 1 over steps without any).
Both factors depend on past verifications only, so the scheduler's choices stay
lossless.

The drafter's own confidences (the positions it drafts itself) are scaled the same
way by a second trust, fed by the verification of those positions: its confidence
head is calibrated on average over many replies, and a reply it cannot predict (its
drafted tokens rejected round after round) then shows the scheduler lower survivals,
so that it verifies less and, verifying nothing for a few steps, stops running the
drafter for that request (the engine's draft gate). The tokens drafted do not change.
"""

from __future__ import annotations

import torch

from .base import DraftOutput, DraftRequest, Drafter, stack_drafts
from .lookup import LookupCalibration, LookupMatch
from .priced_lookup import LookupDrafter, RequestTrust

__all__ = ["HybridDrafter", "RequestTrust"]


class HybridDrafter(LookupDrafter):
    """Lookup and a DSpark drafter under one confidence (see the module docstring)."""

    method = "dspark"
    drafts_block = True
    weightless = False

    def __init__(self, inner: Drafter, calibration: LookupCalibration | None = None,
                 max_ngram: int = 3, min_ngram: int = 1) -> None:
        if getattr(inner, "confidence_head", None) is None:
            raise ValueError("hybrid drafting needs a drafter with a confidence head (method dspark)")
        super().__init__(calibration, max_ngram, min_ngram, inner.max_draft_tokens)
        self.inner = inner
        self.target = inner.target
        self.target_layer_ids = list(inner.target_layer_ids)
        #: the same trust for the drafter's own confidences (see the module docstring)
        self.drafter_trust = RequestTrust()
        #: recent mean drafter confidence per position (None until the drafter ran)
        self.drafter_mean: list[float] | None = None

    @property
    def device(self) -> torch.device:
        return self.inner.device

    @property
    def markov_candidates(self) -> int:
        return self.inner.markov_candidates

    @markov_candidates.setter
    def markov_candidates(self, value: int) -> None:
        self.inner.markov_candidates = value

    # --- per-request state: both parts --------------------------------------------
    def reserve(self, num_slots: int, max_len: int) -> None:
        self.inner.reserve(num_slots, max_len)

    def add_request(self, request_id: object) -> None:
        self.inner.add_request(request_id)
        super().add_request(request_id)

    def release(self, request_id: object) -> None:
        self.inner.release(request_id)
        super().release(request_id)
        self.drafter_trust.release(request_id)

    def num_requests(self) -> int:
        # the largest of the parts' counts, so that a leak in any of them shows
        return max(self.inner.num_requests(), super().num_requests())

    def append_context(self, request_ids, tokens, start_positions, hidden) -> None:
        self.inner.append_context(request_ids, tokens, start_positions, hidden)
        super().append_context(request_ids, tokens, start_positions)

    def rollback(self, request_id: object, length: int) -> None:
        self.inner.rollback(request_id, length)
        super().rollback(request_id, length)

    def context_length(self, request_id: object) -> int:
        return self.inner.context_length(request_id)

    # --- drafting ---------------------------------------------------------------------
    def survivals_with_and_without(self, request_ids: list, contexts: list[tuple[list[int], ...]],
                                   num_tokens: int) -> tuple[list[list[float]], list[list[float]]] | None:
        """For pricing the drafter's call against lookup alone before a step drafts: per
        request, the survivals of lookup's current proposal alone (zeros past its match)
        and an estimate of the hybrid block's (lookup while its confidence is at least
        the drafter's recent mean at that position, then that mean, as the request earns
        it). Recording nothing; None before the drafter has run (nothing to estimate
        from). `contexts` as in `lookup_only`."""
        mean = self.drafter_mean
        if mean is None:
            return None
        alone, hybrid = [], []
        for rid, ctx in zip(request_ids, contexts):
            look = self.peek(rid, num_tokens, *ctx)
            own = self.drafter_trust.preview(rid, mean[:num_tokens])
            s_look, s_hyb, a, h, ahead = [], [], 1.0, 1.0, True
            for k in range(num_tokens):
                c = look[k] if k < len(look) else 0.0
                ahead = ahead and c >= own[k]
                a *= c
                h *= c if ahead else own[k]
                s_look.append(a)
                s_hyb.append(h)
            alone.append(s_look)
            hybrid.append(s_hyb)
        return alone, hybrid

    def _skip_drafter(self, conf: list[float], num_tokens: int) -> bool:
        mean = self.drafter_mean
        return mean is not None and len(conf) >= num_tokens and all(c >= m for c, m in zip(conf, mean[:num_tokens]))

    @torch.no_grad()
    def draft(self, requests: list[DraftRequest], num_tokens: int) -> DraftOutput:
        matches, confs, table_confs = [], [], []
        for req in requests:
            seq = self.history._seq(req.request_id)
            if req.anchor_position != len(seq):
                raise ValueError(f"request {req.request_id!r}: anchor at position {req.anchor_position} but the "
                                 f"drafter holds {len(seq)} context tokens")
            m, c, table_c = self._propose(req.request_id, num_tokens, seq, [req.anchor_token])
            matches.append(m)
            confs.append(c)
            table_confs.append(table_c)
        need = [i for i, c in enumerate(confs) if not self._skip_drafter(c, num_tokens)]
        r = len(requests)
        from_lookup = [num_tokens] * r  # rows that skip the drafter are all lookup
        own: list[list[float]] = [[] for _ in range(r)]  # the drafter's raw c_k after the lookup tokens
        out = None
        if need:
            out = self.inner.draft([requests[i] for i in need], num_tokens,
                                   lookup=[(matches[i].tokens, confs[i]) for i in need])
            for j, i in enumerate(need):
                from_lookup[i] = int(out.num_lookup[j])
            self._update_drafter_mean(out, num_tokens)
            out = self._earned(out, [requests[i].request_id for i in need], [from_lookup[i] for i in need],
                               [own[i] for i in need])
        self.counts["drafter_skipped"] += r - len(need)
        for i, req in enumerate(requests):
            self._last[req.request_id] = (matches[i], from_lookup[i], confs[i], table_confs[i], own[i])
            self.mix[from_lookup[i]] += 1
            self.counts["lookup_tokens"] += from_lookup[i]
            self.counts["drafter_tokens"] += num_tokens - from_lookup[i]
        self.counts["requests"] += r
        if len(need) == r:  # the common case: the drafter's output is the whole block
            return DraftOutput(out.tokens, out.logits, out.confidence, num_lookup=out.num_lookup)
        return self._assemble(out, need, matches, confs, num_tokens)

    def _assemble(self, out, need: list[int], matches: list[LookupMatch], confs: list[list[float]],
                  num_tokens: int) -> DraftOutput:
        """The block of every request: the drafter's rows for `need`, lookup alone (point
        mass q, every token from the match) for the others."""
        dev = self.inner.device
        drafted = set(need)
        rest = [i for i in range(len(matches)) if i not in drafted]
        alone = DraftOutput(
            torch.tensor([matches[i].tokens[:num_tokens] for i in rest], dtype=torch.long, device=dev), None,
            torch.tensor([confs[i][:num_tokens] for i in rest], device=dev),
            num_lookup=torch.full((len(rest),), num_tokens, dtype=torch.long, device=dev))
        return stack_drafts(len(matches), [(need, out), (rest, alone)])

    def _earned(self, out: DraftOutput, request_ids: list, num_lookup: list[int],
                own: list[list[float]]) -> DraftOutput:
        """The drafter's confidences at its own positions as each request earns them
        (`drafter_trust`); their raw values go into `own` (one list per row)."""
        if out.confidence is None or not self.drafter_trust.enabled:
            return out  # nothing to scale, nothing to record
        conf = out.confidence.float().cpu().clone()  # a copy (the output may be an inference tensor)
        rows = conf.tolist()
        for j, (rid, n) in enumerate(zip(request_ids, num_lookup)):
            own[j].extend(rows[j][n:])
            if own[j]:
                conf[j, n:] = torch.tensor(self.drafter_trust.adjust(rid, own[j]))
        out.confidence = conf.to(out.confidence.device, out.confidence.dtype)
        return out

    def _update_drafter_mean(self, out, num_tokens: int, rate: float = 0.05) -> None:
        """EMA of the drafter's own confidences (rows and positions it drafted itself)."""
        c = out.confidence.float()
        own = torch.arange(num_tokens, device=c.device).unsqueeze(0) >= out.num_lookup.to(c.device).unsqueeze(1)
        counts = own.sum(0)
        means = ((c * own).sum(0) / counts.clamp_min(1)).tolist()  # one transfer, not one per position
        mean = self.drafter_mean or [0.0] * self.max_draft_tokens
        for k, (n, x) in enumerate(zip(counts.tolist(), means)):
            if n > 0:
                mean[k] = x if self.drafter_mean is None else (1 - rate) * mean[k] + rate * x
        self.drafter_mean = mean

    def _observe_own(self, request_id: object, own: list[float], verified: int, accepted: int) -> None:
        self.drafter_trust.observe(request_id, own, verified, accepted)
