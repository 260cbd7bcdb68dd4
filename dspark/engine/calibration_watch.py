"""Serving-time check of the drafter's confidences against what verification finds.

The scheduler trusts the drafter's conditional confidences c_k = P(token k accepted
| tokens before it accepted) as calibrated at training time. `CalibrationWatch`
keeps the recent (c_k, outcome) pairs of every verified position, where position k
is a trial when the tokens before it were accepted, and reports the expected
calibration error over them, the mean predicted and the observed acceptance per
position, and a warning when the ECE drifts past a bound (e.g. traffic from a
domain the drafter was not calibrated on).
"""

from __future__ import annotations

import logging
import time
from collections import deque

log = logging.getLogger("dspark.engine")


class CalibrationWatch:
    #: (confidence, outcome) pairs the ECE is computed over
    window = 20000
    #: an ECE above this, over at least `min_samples` pairs, logs a warning ...
    warn_ece = 0.1
    min_samples = 2000
    #: ... at most this often (seconds)
    warn_every_s = 300.0

    def __init__(self, positions: int = 16) -> None:
        self.positions = positions
        self.recent: deque[tuple[int, float, float]] = deque(maxlen=self.window)
        self.warnings = 0
        self._warned_at = float("-inf")
        self._ece_cache: tuple[int, float] | None = None
        self.observed = 0

    def observe(self, confidences: list[list[float] | None], lengths: list[int], accepted: list[int]) -> None:
        """One verification round: per request the confidences of its drafted tokens
        (None: not drafted or no confidence head), how many were verified and how many
        of those accepted."""
        for conf, n, a in zip(confidences, lengths, accepted):
            if conf is None or n <= 0:
                continue
            for k in range(min(n, a + 1, len(conf))):
                self.recent.append((k, conf[k], 1.0 if k < a else 0.0))
                self.observed += 1
        self._maybe_warn()

    def ece(self) -> float:
        """ECE of the recent confidences (NaN before any verified draft token)."""
        from dspark.calibration import ece

        if self._ece_cache is not None and self._ece_cache[0] == self.observed:
            return self._ece_cache[1]
        value = float("nan") if not self.recent else ece([c for _, c, _ in self.recent], [y for _, _, y in self.recent])
        self._ece_cache = (self.observed, value)
        return value

    def per_position(self) -> dict[int, tuple[float, float, int]]:
        """position -> (mean predicted c_k, observed acceptance, trials) over the window."""
        sums: dict[int, list[float]] = {}
        for k, c, y in self.recent:
            s = sums.setdefault(k, [0.0, 0.0, 0])
            s[0] += c
            s[1] += y
            s[2] += 1
        return {k: (p / n, o / n, int(n)) for k, (p, o, n) in sorted(sums.items())}

    def _maybe_warn(self) -> None:
        now = time.monotonic()
        if len(self.recent) < self.min_samples or now - self._warned_at < self.warn_every_s:
            return
        value = self.ece()
        if value > self.warn_ece:
            self._warned_at = now
            self.warnings += 1
            rows = ", ".join(f"pos {k}: predicted {p:.2f} observed {o:.2f}"
                             for k, (p, o, _) in list(self.per_position().items())[:4])
            log.warning("the drafter's confidences have drifted from what verification finds: ECE %.3f over the "
                        "last %d draft tokens (bound %.2f; %s). The scheduler's verification lengths are off; "
                        "recalibrate the drafter on this traffic (dspark calibrate).", value, len(self.recent),
                        self.warn_ece, rows)
