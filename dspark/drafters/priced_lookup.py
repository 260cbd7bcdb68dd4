"""Prompt lookup priced by the scheduler: calibrated confidences, no drafter.

`LookupDrafter` proposes what prompt lookup proposes (`dspark.drafters.lookup.lookup`:
the longest earlier match of a request's suffix, its majority continuation) with a
confidence per token: the calibrated conditional acceptance of the match's class and
position (`LookupCalibration`, shipped or fitted with `dspark calibrate-lookup`, kept
up to date from every verification), scaled by how the workload and the request earn
it (`RequestTrust`). The engine never runs a drafter block for it: every request's
row is a lookup row, whose verification length the scheduler chooses on the target's
step time alone (`dspark.schedule.lookup_pricing.free_lengths`), so a request verifies
many tokens where its text copies and none where it does not. That is the speculation
of a target without a trained drafter under adaptive verification
(`{"method": "ngram", "enable_adaptive_verification": true}`).

Lookup tokens are deterministic functions of the context and verified as point masses:
exact whatever the confidences. `HybridDrafter` (dspark.drafters.hybrid) adds a DSpark
block to the same lookup.
"""

from __future__ import annotations

from collections import Counter

import torch

from .base import DraftOutput, DraftRequest, Drafter
from .lookup import LookupCalibration, LookupMatch
from .ngram import NgramDrafter
from .reply_history import ReplyHistory


class RequestTrust:
    """How far lookup's acceptance runs from the calibration table's prediction: on the
    current workload (all requests, the last few hundred verified lookup tokens) and,
    relative to that, per request (its last ten or so). See "Trust" in the docstring of
    dspark.drafters.hybrid."""

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
    #: (docs/journal.md). Off until a scheduler that prices lookup right
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
        return self._scaled(f, conf)

    def preview(self, request_id: object, conf: list[float]) -> list[float]:
        """`adjust` without counting a step (pricing a choice before the step's own call)."""
        return self._scaled(self.factor(request_id), conf) if self.enabled else conf

    def _scaled(self, f: float, conf: list[float]) -> list[float]:
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


class LookupDrafter(Drafter):
    """Prompt lookup with calibrated, earned confidences (see the module docstring)."""

    method = "ngram"
    weightless = True
    #: the engine gives rows it does not draft for to `lookup_only`
    lookup_enabled = True
    #: False: no drafter block to run, every row is a lookup row
    drafts_block = False

    def __init__(self, calibration: LookupCalibration | None = None, max_ngram: int = 3, min_ngram: int = 1,
                 max_draft_tokens: int = 7, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.target_layer_ids = []
        self.max_draft_tokens = max_draft_tokens
        self._device = torch.device(device)
        self.history = NgramDrafter(max_ngram, min_ngram, max_draft_tokens)
        self.calibration = calibration if calibration is not None else LookupCalibration.load()
        self.trust = RequestTrust()
        #: earlier replies to look up in when a request's own tokens have no strong
        #: match (dspark.drafters.reply_history); None: the request's own tokens alone
        self.reply_history: ReplyHistory | None = None
        #: requests outside the shared namespace, with theirs (the reply history's key)
        self._namespaces: dict[object, str] = {}
        #: per request, its last lookup proposal: (match, tokens taken from it, the
        #: confidences used, the table's confidences, the drafter's own confidences
        #: for the positions after the lookup tokens: none here)
        self._last: dict[object, tuple[LookupMatch, int, list[float], list[float], list[float]]] = {}
        self.counts = {"lookup_tokens": 0, "drafter_tokens": 0, "drafter_skipped": 0, "requests": 0,
                       "lookup_only": 0}
        #: rows by how many leading tokens came from lookup (0 = the drafter's only)
        self.mix: Counter[int] = Counter()

    @property
    def device(self) -> torch.device:
        return self._device

    # --- per-request state: the token history -------------------------------------------
    def add_request(self, request_id: object) -> None:
        self.history.add_request(request_id)

    def release(self, request_id: object) -> None:
        self.history.release(request_id)
        self._last.pop(request_id, None)
        self.trust.release(request_id)
        self._namespaces.pop(request_id, None)

    def num_requests(self) -> int:
        # the larger of the two counts, so that a leak in either shows
        return max(self.history.num_requests(), len(self._last), len(self._namespaces))

    def append_context(self, request_ids, tokens, start_positions, hidden=None) -> None:
        self.history.append_context(request_ids, tokens, start_positions)

    def rollback(self, request_id: object, length: int) -> None:
        self.history.rollback(request_id, length)

    def context_length(self, request_id: object) -> int:
        return self.history.context_length(request_id)

    # --- proposals ------------------------------------------------------------------------
    def _propose(self, request_id: object, num_tokens: int,
                 *parts: list[int]) -> tuple[LookupMatch, list[float], list[float]]:
        """Lookup's proposal over the concatenation of `parts` (the request's emitted
        tokens, anchor last): (match, confidences as this request earns them, the
        table's confidences)."""
        m = self._match(request_id, num_tokens, parts)
        table_c = self.calibration.confidence(m)
        return m, self.trust.adjust(request_id, table_c), table_c

    def _match(self, request_id: object, num_tokens: int, parts: tuple[list[int], ...]) -> LookupMatch:
        """The request's own longest match; where that is shorter than the reply
        history's n-gram (or missing), what earlier replies continued its last tokens
        with, if any (a class of its own in the calibration table)."""
        index = self.history.suffix_index(request_id, *parts)
        m = LookupMatch(*index.most_frequent(num_tokens))
        h = self.reply_history
        if h is not None and m.ngram < h.ngram:
            tokens, agreed = h.propose(index.tokens[-h.ngram:], num_tokens, self._namespaces.get(request_id))
            if tokens:
                return LookupMatch(tokens, h.ngram, agreed, source="h")
        return m

    def remember_reply(self, reply: list[int], namespace: str | None = None) -> None:
        """A finished request's output, for the reply history of its namespace (when there
        is a history)."""
        if self.reply_history is not None:
            self.reply_history.add(reply, namespace)

    def set_namespace(self, request_id: object, namespace: str | None) -> None:
        if namespace is None:
            self._namespaces.pop(request_id, None)
        else:
            self._namespaces[request_id] = namespace

    def peek(self, request_id: object, num_tokens: int, *parts: list[int]) -> list[float]:
        """The confidences of lookup's current proposal (`_propose`'s, one for each
        matched token), recording nothing: for pricing a step's choice before it is made."""
        m = self._match(request_id, num_tokens, parts)
        return self.trust.preview(request_id, self.calibration.confidence(m))[:len(m.tokens)]

    def draft(self, requests: list[DraftRequest], num_tokens: int) -> DraftOutput:
        """Lookup for every request over the context it was given (`lookup_only`'s rows)."""
        for req in requests:
            if req.anchor_position != self.context_length(req.request_id):
                raise ValueError(f"request {req.request_id!r}: anchor at position {req.anchor_position} but the "
                                 f"drafter holds {self.context_length(req.request_id)} context tokens")
        return self.lookup_only([r.request_id for r in requests],
                                [(self.history._seq(r.request_id), [r.anchor_token]) for r in requests], num_tokens)

    def lookup_only(self, request_ids: list, contexts: list[tuple[list[int], ...]], num_tokens: int) -> DraftOutput:
        """Prompt lookup alone (no drafter block runs): what the engine proposes for
        requests it does not draft for, since a lookup token costs verification but no
        drafter time. `contexts` are the requests' whole token sequences, anchor last,
        each as the parts to concatenate (prompt, output). Each row: the match's tokens
        then -1 (`num_valid` says how many are real), their confidences then 0, and no
        logits (point masses, as in n-gram drafting)."""
        found, confs = self.lookup_lists(request_ids, contexts, num_tokens)
        dev = self.device
        tokens = torch.tensor([t + [-1] * (num_tokens - len(t)) for t in found], dtype=torch.long)
        conf = torch.tensor([c + [0.0] * (num_tokens - len(c)) for c in confs])
        valid = torch.tensor([len(t) for t in found], dtype=torch.long)
        return DraftOutput(tokens.to(dev), None, conf.to(dev), num_valid=valid.to(dev), num_lookup=valid.to(dev))

    def lookup_lists(self, request_ids: list, contexts: list[tuple[list[int], ...]],
                     num_tokens: int) -> tuple[list[list[int]], list[list[float]]]:
        """`lookup_only` as Python lists, for a step that only looks up (the engine then
        chooses lengths without a tensor): per request, the match's tokens (at most
        `num_tokens`, none where nothing matched) and a confidence for each."""
        found, confs = [], []
        for rid, ctx in zip(request_ids, contexts):
            m, c, table_c = self._propose(rid, num_tokens, *ctx)
            n = len(m.tokens)
            found.append(m.tokens)
            confs.append(c[:n])
            self._last[rid] = (m, n, c, table_c, [])
            self.mix[n] += 1
            self.counts["lookup_tokens"] += n
        self.counts["requests"] += len(found)
        self.counts["lookup_only"] += len(found)
        return found, confs

    # --- online learning --------------------------------------------------------------------
    def record_verification(self, request_ids: list[object], lengths: list[int], accepted: list[int]) -> None:
        """Feed the outcome of the last verification back into the lookup calibration
        (the confidences used, for its ECE) and the request's trust (the table's)."""
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
                self._observe_own(rid, own, length - num_lookup, acc - num_lookup)

    def _observe_own(self, request_id: object, own: list[float], verified: int, accepted: int) -> None:
        """The verification of a drafter's own positions (the hybrid's trust in its drafter)."""
