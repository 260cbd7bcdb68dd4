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

from collections import Counter

import torch

from .base import DraftOutput, DraftRequest, Drafter, stack_drafts
from .lookup import LookupCalibration, LookupMatch
from .ngram import NgramDrafter


class RequestTrust:
    """How far lookup's acceptance runs from the calibration table's prediction: on the
    current workload (all requests, the last few hundred verified lookup tokens) and,
    relative to that, per request (its last ten or so). See the module docstring."""

    #: pseudo-observations of "as predicted" each factor starts from (workload, request)
    prior = (10.0, 2.0)
    #: weight kept per verified token: the workload factor remembers about the last
    #: 200 tokens, a request's about the last 10
    token_decay = (0.995, 0.9)
    #: a request's weight kept per step without a verified lookup token (after about
    #: 30 such steps the workload's word is back)
    step_decay = 0.97
    #: no adjusted confidence goes above this
    cap = 0.995
    #: True: a factor above 1 scales a confidence's odds, not the confidence. Linear
    #: scaling with the cap pushes a request on a run of hits to the cap (at 16 requests
    #: survivals predicted at 0.98 were accepted 0.62 of the time); scaling the odds
    #: brought the lookup tokens' predicted acceptance within 6 % of the observed, but
    #: not the throughput: engines in turn, held in speculation, odds against linear
    #: 1.129 / 1.143 at 1 request, 0.967 / 0.971 at 4, 0.846 / 0.842 at 16
    #: (docs/benchmarks/governed.md). Off until a scheduler that prices lookup right
    #: makes calibration pay.
    odds_up = False

    def __init__(self, enabled: bool = True) -> None:
        #: False: the table's confidences as they are (for tests that need a fixed mix)
        self.enabled = enabled
        self._workload = [0.0, 0.0]  # [sum predicted, sum accepted], over all requests
        self._stats: dict[object, list[float]] = {}  # the same per request, against the workload-adjusted

    @staticmethod
    def _ratio(st: list[float] | None, prior: float) -> float:
        return 1.0 if st is None else (st[1] + prior) / (st[0] + prior)

    def workload_factor(self) -> float:
        return self._ratio(self._workload, self.prior[0])

    def factor(self, request_id: object) -> float:
        return self.workload_factor() * self._ratio(self._stats.get(request_id), self.prior[1])

    def adjust(self, request_id: object, conf: list[float]) -> list[float]:
        """The table's confidences for this request's match, as the workload and this
        request earn them (called once per request and step)."""
        if not self.enabled:
            return conf
        f = self.factor(request_id)
        st = self._stats.get(request_id)
        if st is not None:
            st[0] *= self.step_decay
            st[1] *= self.step_decay
        if f == 1.0:
            return conf
        if f < 1.0 or not self.odds_up:
            return [min(c * f, self.cap) for c in conf]
        return [min(c * f / (1.0 - c + c * f), self.cap) for c in conf]

    def observe(self, request_id: object, predicted: list[float], verified: int, accepted: int) -> None:
        """A verification of this request's first `verified` lookup tokens, whose table
        confidences were `predicted`, the first `accepted` of them accepted."""
        g = self.workload_factor()  # the request's own factor is measured against this
        st = self._stats.setdefault(request_id, [0.0, 0.0])
        for k in range(min(verified, accepted + 1, len(predicted))):
            hit = 1.0 if k < accepted else 0.0
            self._workload[0] = self._workload[0] * self.token_decay[0] + predicted[k]
            self._workload[1] = self._workload[1] * self.token_decay[0] + hit
            st[0] = st[0] * self.token_decay[1] + min(predicted[k] * g, self.cap)
            st[1] = st[1] * self.token_decay[1] + hit

    def release(self, request_id: object) -> None:
        self._stats.pop(request_id, None)


class HybridDrafter(Drafter):
    """Lookup and a DSpark drafter under one confidence (see the module docstring)."""

    method = "dspark"
    lookup_enabled = True

    def __init__(self, inner: Drafter, calibration: LookupCalibration | None = None,
                 max_ngram: int = 3, min_ngram: int = 1) -> None:
        super().__init__()
        if getattr(inner, "confidence_head", None) is None:
            raise ValueError("hybrid drafting needs a drafter with a confidence head (method dspark)")
        self.inner = inner
        self.target = inner.target
        self.target_layer_ids = list(inner.target_layer_ids)
        self.max_draft_tokens = inner.max_draft_tokens
        self.history = NgramDrafter(max_ngram, min_ngram, inner.max_draft_tokens)
        self.calibration = calibration if calibration is not None else LookupCalibration.load()
        self.trust = RequestTrust()
        #: the same for the drafter's own confidences (see the module docstring)
        self.drafter_trust = RequestTrust()
        #: recent mean drafter confidence per position (None until the drafter ran)
        self.drafter_mean: list[float] | None = None
        #: per request, its last lookup proposal: (match, tokens taken from it, the
        #: confidences used, the table's confidences, the drafter's own confidences
        #: for the positions after the lookup tokens)
        self._last: dict[object, tuple[LookupMatch, int, list[float], list[float], list[float]]] = {}
        self.counts = {"lookup_tokens": 0, "drafter_tokens": 0, "drafter_skipped": 0, "requests": 0,
                       "lookup_only": 0}
        #: rows drafted by how many leading tokens came from lookup (0 = drafter only)
        self.mix: Counter[int] = Counter()

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
        self.history.add_request(request_id)

    def release(self, request_id: object) -> None:
        self.inner.release(request_id)
        self.history.release(request_id)
        self._last.pop(request_id, None)
        self.trust.release(request_id)
        self.drafter_trust.release(request_id)

    def num_requests(self) -> int:
        # the largest of the parts' counts, so that a leak in any of them shows
        return max(self.inner.num_requests(), self.history.num_requests(), len(self._last))

    def append_context(self, request_ids, tokens, start_positions, hidden) -> None:
        self.inner.append_context(request_ids, tokens, start_positions, hidden)
        self.history.append_context(request_ids, tokens, start_positions)

    def rollback(self, request_id: object, length: int) -> None:
        self.inner.rollback(request_id, length)
        self.history.rollback(request_id, length)

    def context_length(self, request_id: object) -> int:
        return self.inner.context_length(request_id)

    # --- drafting ---------------------------------------------------------------------
    def _skip_drafter(self, conf: list[float], num_tokens: int) -> bool:
        mean = self.drafter_mean
        return mean is not None and len(conf) >= num_tokens and all(c >= m for c, m in zip(conf, mean[:num_tokens]))

    def _propose(self, request_id: object, num_tokens: int,
                 *parts: list[int]) -> tuple[LookupMatch, list[float], list[float]]:
        """Lookup's proposal over the concatenation of `parts` (the request's emitted
        tokens, anchor last): (match, confidences as this request earns them, the
        table's confidences)."""
        m = LookupMatch(*self.history.suffix_index(request_id, *parts).most_frequent(num_tokens))
        table_c = self.calibration.confidence(m)
        return m, self.trust.adjust(request_id, table_c), table_c

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

    def lookup_only(self, request_ids: list, contexts: list[tuple[list[int], ...]], num_tokens: int) -> DraftOutput:
        """Prompt lookup alone (the drafter is not run): what the engine proposes for
        requests the scheduler leaves out of drafting, since a lookup token costs
        verification but no drafter time. `contexts` are the requests' whole token
        sequences, anchor last, each as the parts to concatenate (prompt, output). Each
        row: the match's tokens then -1 (`num_valid` says how many are real), their
        confidences then 0, and no logits (point masses, as in n-gram drafting)."""
        r, dev = len(request_ids), self.inner.device
        tokens = [[-1] * num_tokens for _ in range(r)]
        conf = [[0.0] * num_tokens for _ in range(r)]
        valid = [0] * r
        for i, (rid, ctx) in enumerate(zip(request_ids, contexts)):
            m, c, table_c = self._propose(rid, num_tokens, *ctx)
            n = len(m.tokens)
            tokens[i][:n] = m.tokens
            conf[i][:n] = c[:n]
            valid[i] = n
            self._last[rid] = (m, n, c, table_c, [])
            self.mix[n] += 1
            self.counts["lookup_tokens"] += n
        self.counts["requests"] += r
        self.counts["lookup_only"] += r
        tokens, conf, valid = (torch.tensor(tokens, dtype=torch.long), torch.tensor(conf),
                               torch.tensor(valid, dtype=torch.long))
        return DraftOutput(tokens.to(dev), None, conf.to(dev), num_valid=valid.to(dev), num_lookup=valid.to(dev))

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

    def record_verification(self, request_ids: list[object], lengths: list[int], accepted: list[int]) -> None:
        """Feed the outcome of the last verification back into the lookup calibration
        (the confidences used, for its ECE), the request's trust (the table's) and its
        trust in the drafter (the drafter's own confidences)."""
        for rid, length, acc in zip(request_ids, lengths, accepted):
            last = self._last.pop(rid, None)
            if last is None:
                continue
            match, num_lookup, conf, table_conf, own = last
            verified = min(length, num_lookup)
            self.calibration.observe(match, verified, min(acc, verified), conf)
            if verified > 0:
                self.trust.observe(rid, table_conf, verified, min(acc, verified))
            if own and length > num_lookup and acc >= num_lookup:  # the drafter's positions were reached
                self.drafter_trust.observe(rid, own, length - num_lookup, acc - num_lookup)
