"""Prompt lookup with calibrated confidence.

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

The hybrid drafter that puts lookup and a DSpark block under one scheduler is in
`dspark.drafters.hybrid`.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .suffix_index import SuffixIndex

SHIPPED_CALIBRATION = Path(__file__).parent / "lookup_calibration.json"
FORMAT = "dspark-lookup-calibration/1"


@dataclass
class LookupMatch:
    tokens: list[int] = field(default_factory=list)  # proposed continuation, target ids
    ngram: int = 0  # length of the matched suffix; 0 = no match
    agreed: bool = True  # every earlier occurrence continued with the same token
    #: where it was found: "" the request's own tokens, "h" earlier replies (reply_history)
    source: str = ""

    @property
    def key(self) -> str:
        return f"{self.source}{self.ngram}{'a' if self.agreed else 'c'}"


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
    memory = 1000.0
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
        from dspark.calibration import ece

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
