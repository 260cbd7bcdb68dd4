"""Prompt lookup with calibrated confidence, and the hybrid drafter that puts it and a
DSpark block under one scheduler.

Lookup. For a request's tokens `seq` (prompt, accepted output, then the anchor) the
longest suffix n-gram (n = max_ngram..min_ngram) that occurred earlier is found; the
tokens that followed its occurrences are the candidate continuations. Where they
disagree, the continuation whose first token is the most frequent wins (ties: the
latest occurrence), and the match records that it was contested.

Calibration. The confidence of lookup token k is the measured conditional acceptance
P(token k accepted | tokens 1..k-1 accepted) for the match's (n-gram length, agreed or
contested) class and position k, counted as Beta(1, 1)-smoothed successes/trials:
fitted on the target's own greedy replies (`fit_lookup_calibration`, the shipped table
`lookup_calibration.json`) and kept up to date online from every verification (counts
decay past `LookupCalibration.memory` trials per cell, so that a new domain moves it).
Predicted confidences and outcomes are kept for an online ECE.

Hybrid (`HybridDrafter`). Per request and position k, left to right, the proposal with
the higher calibrated confidence: the lookup token while lookup is ahead and has not
been passed over yet, then the DSpark drafter (whose Markov head conditions on the
lookup tokens chosen before it). The choice at k uses only what is known before token
k is drawn (the lookup match and the drafter's c_k, a function of tokens < k), and a
lookup token is recorded with its exact draft distribution, a point mass, so
verification stays lossless. A request whose lookup proposal fills the whole block at
confidences no lower than the drafter's recent average skips the drafter.
"""

from __future__ import annotations

import json
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .base import DraftOutput, DraftRequest, Drafter, stack_drafts
from .ngram import NgramDrafter
from .suffix_index import SuffixIndex

SHIPPED_CALIBRATION = Path(__file__).parent / "lookup_calibration.json"
FORMAT = "dspark-lookup-calibration/1"


@dataclass
class LookupMatch:
    tokens: list[int] = field(default_factory=list)  # proposed continuation, target ids
    ngram: int = 0  # length of the matched suffix; 0 = no match
    agreed: bool = True  # every earlier occurrence continued with the same token

    @property
    def key(self) -> str:
        return f"{self.ngram}{'a' if self.agreed else 'c'}"


def lookup(seq: list[int] | torch.Tensor, num_tokens: int, max_ngram: int = 3, min_ngram: int = 1) -> LookupMatch:
    """The continuation of the longest earlier match of `seq`'s suffix (see the module
    docstring); an empty match when nothing matches."""
    s = seq if isinstance(seq, torch.Tensor) else torch.tensor(seq, dtype=torch.long)
    length = s.numel()
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        windows = s[: length - 1].unfold(0, n, 1)  # every n-gram that ends before the last token
        hits = (windows == s[length - n:]).all(dim=1).nonzero().flatten() + n  # where each continuation starts
        if not hits.numel():
            continue
        firsts = s[hits]
        values, counts = firsts.unique(return_counts=True)
        best = counts.max()
        winners = values[counts == best]
        # the latest occurrence whose first token is among the most frequent
        chosen = int(hits[torch.isin(firsts, winners)][-1])
        return LookupMatch(s[chosen: chosen + num_tokens].tolist(), n, values.numel() == 1)
    return LookupMatch()


class LookupCalibration:
    """Conditional acceptance of lookup tokens by (match class, position)."""

    #: trials per cell beyond which old counts decay (online updates then weigh as much)
    memory = 4000.0
    #: (confidence, outcome) pairs kept for the online ECE
    window = 20000

    def __init__(self, positions: int = 16, counts: dict | None = None, fitted_on: str = "") -> None:
        self.positions = positions
        self.accepted: dict[str, list[float]] = {}
        self.trials: dict[str, list[float]] = {}
        self.fitted_on = fitted_on
        for key, (acc, tri) in (counts or {}).items():
            self.accepted[key] = [float(x) for x in acc[:positions]] + [0.0] * max(0, positions - len(acc))
            self.trials[key] = [float(x) for x in tri[:positions]] + [0.0] * max(0, positions - len(tri))
        self.recent: deque[tuple[float, float]] = deque(maxlen=self.window)

    def _cell(self, key: str) -> tuple[list[float], list[float]]:
        if key not in self.trials:
            self.accepted[key] = [0.0] * self.positions
            self.trials[key] = [0.0] * self.positions
        return self.accepted[key], self.trials[key]

    def confidence(self, match: LookupMatch) -> list[float]:
        """Per proposed token, P(accepted | earlier tokens accepted)."""
        if not match.tokens:
            return []
        acc, tri = self.accepted.get(match.key), self.trials.get(match.key)
        out = []
        for k in range(min(len(match.tokens), self.positions)):
            a, t = (acc[k], tri[k]) if acc is not None else (0.0, 0.0)
            out.append((a + 1.0) / (t + 2.0))
        return out + [out[-1]] * (len(match.tokens) - len(out)) if out else out

    def observe(self, match: LookupMatch, verified: int, accepted: int, predicted: list[float] | None = None) -> None:
        """Count one verification of the first `verified` lookup tokens of `match`, of
        which the first `accepted` were accepted (position k is a trial when tokens
        before it were accepted)."""
        if not match.tokens or verified <= 0:
            return
        acc, tri = self._cell(match.key)
        for k in range(min(verified, accepted + 1, self.positions)):
            tri[k] += 1.0
            hit = 1.0 if k < accepted else 0.0
            acc[k] += hit
            if predicted is not None and k < len(predicted):
                self.recent.append((predicted[k], hit))
            if tri[k] > self.memory:
                scale = self.memory / tri[k]
                tri[k] *= scale
                acc[k] *= scale

    def ece(self) -> float:
        """ECE of the confidences given to verified lookup tokens since start-up."""
        from dspark.eval.calibration import ece

        if not self.recent:
            return float("nan")
        conf, hit = zip(*self.recent)
        return ece(list(conf), list(hit))

    def table(self) -> dict[str, list[float]]:
        """Smoothed conditional acceptance per class and position (for reports)."""
        return {key: [(a + 1.0) / (t + 2.0) for a, t in zip(self.accepted[key], self.trials[key])]
                for key in sorted(self.trials)}

    def to_dict(self) -> dict:
        return {"format": FORMAT, "positions": self.positions, "fitted_on": self.fitted_on,
                "counts": {k: [[round(x, 3) for x in self.accepted[k]], [round(x, 3) for x in self.trials[k]]]
                           for k in sorted(self.trials)}}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path = SHIPPED_CALIBRATION) -> "LookupCalibration":
        from .config import DrafterConfigError

        try:
            d = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise DrafterConfigError(f"cannot read the lookup calibration {path}: {e}") from None
        if not isinstance(d, dict) or d.get("format") != FORMAT or not isinstance(d.get("counts"), dict):
            raise DrafterConfigError(f"{path} is not a lookup calibration ({FORMAT})")
        return cls(int(d.get("positions", 16)), d["counts"], str(d.get("fitted_on", "")))


def fit_lookup_calibration(
    sequences: list[tuple[list[int], list[int]]],
    num_tokens: int = 7,
    max_ngram: int = 3,
    min_ngram: int = 1,
    fitted_on: str = "",
) -> LookupCalibration:
    """Counts from (prompt ids, the target's greedy reply ids) pairs: at every reply
    position the lookup proposal over prompt + reply so far is compared with the reply's
    next tokens, which is exactly what greedy verification of it would accept."""
    cal = LookupCalibration(max(16, num_tokens), fitted_on=fitted_on)
    for prompt, reply in sequences:
        index = SuffixIndex(max_ngram, min_ngram)
        index.sync(list(prompt))
        for t in range(len(reply) - 1):
            index.push(int(reply[t]))  # context + anchor (reply[t])
            match = LookupMatch(*index.most_frequent(num_tokens))
            future = reply[t + 1: t + 1 + len(match.tokens)]
            if not match.tokens or not future:
                continue
            accepted = 0
            while accepted < len(future) and match.tokens[accepted] == future[accepted]:
                accepted += 1
            cal.observe(match, len(future), accepted)
    return cal


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
        #: recent mean drafter confidence per position (None until the drafter ran)
        self.drafter_mean: list[float] | None = None
        self._last: dict[object, tuple[LookupMatch, int, list[float]]] = {}
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

    @torch.no_grad()
    def draft(self, requests: list[DraftRequest], num_tokens: int) -> DraftOutput:
        matches, confs = [], []
        for req in requests:
            seq = self.history._seq(req.request_id)
            if req.anchor_position != len(seq):
                raise ValueError(f"request {req.request_id!r}: anchor at position {req.anchor_position} but the "
                                 f"drafter holds {len(seq)} context tokens")
            m = LookupMatch(*self.history.suffix_index(req.request_id, seq, [req.anchor_token])
                            .most_frequent(num_tokens))
            matches.append(m)
            confs.append(self.calibration.confidence(m))
        need = [i for i, c in enumerate(confs) if not self._skip_drafter(c, num_tokens)]
        r = len(requests)
        from_lookup = [num_tokens] * r  # rows that skip the drafter are all lookup
        out = None
        if need:
            out = self.inner.draft([requests[i] for i in need], num_tokens,
                                   lookup=[(matches[i].tokens, confs[i]) for i in need])
            for j, i in enumerate(need):
                from_lookup[i] = int(out.num_lookup[j])
            self._update_drafter_mean(out, num_tokens)
        self.counts["drafter_skipped"] += r - len(need)
        for i, req in enumerate(requests):
            self._last[req.request_id] = (matches[i], from_lookup[i], confs[i])
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
        sequences, anchor last, each as the parts to concatenate (prompt, output). Each row: the match's tokens then -1 (`num_valid` says
        how many are real), their calibrated confidences then 0, and no logits (point
        masses, as in n-gram drafting)."""
        r, dev = len(request_ids), self.inner.device
        tokens = torch.full((r, num_tokens), -1, dtype=torch.long)
        conf = torch.zeros(r, num_tokens)
        valid = torch.zeros(r, dtype=torch.long)
        for i, (rid, ctx) in enumerate(zip(request_ids, contexts)):
            m = LookupMatch(*self.history.suffix_index(rid, *ctx).most_frequent(num_tokens))
            c = self.calibration.confidence(m)
            n = len(m.tokens)
            if n:
                tokens[i, :n] = torch.tensor(m.tokens, dtype=torch.long)
                conf[i, :n] = torch.tensor(c[:n])
            valid[i] = n
            self._last[rid] = (m, n, c)
            self.mix[n] += 1
            self.counts["lookup_tokens"] += n
        self.counts["requests"] += r
        self.counts["lookup_only"] += r
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

    def _update_drafter_mean(self, out, num_tokens: int, rate: float = 0.05) -> None:
        """EMA of the drafter's own confidences (rows and positions it drafted itself)."""
        c = out.confidence.float()
        own = torch.arange(num_tokens, device=c.device).unsqueeze(0) >= out.num_lookup.to(c.device).unsqueeze(1)
        counts = own.sum(0)
        sums = (c * own).sum(0)
        mean = self.drafter_mean or [0.0] * self.max_draft_tokens
        for k in range(num_tokens):
            if counts[k] > 0:
                x = float(sums[k] / counts[k])
                mean[k] = x if self.drafter_mean is None else (1 - rate) * mean[k] + rate * x
        self.drafter_mean = mean

    def record_verification(self, request_ids: list[object], lengths: list[int], accepted: list[int]) -> None:
        """Feed the outcome of the last verification back into the lookup calibration."""
        for rid, length, acc in zip(request_ids, lengths, accepted):
            last = self._last.pop(rid, None)
            if last is None:
                continue
            match, num_lookup, conf = last
            verified = min(length, num_lookup)
            self.calibration.observe(match, verified, min(acc, verified), conf)
