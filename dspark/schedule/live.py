"""The step-time table kept true while serving.

A profile is measured once, before serving, with one shape per token count (requests
of `tokens_per_request` tokens each) on a machine whose speed drifts. The engine's
steps have other shapes (sixteen requests of one or two tokens each cost more than two
requests of eight: more attention over more contexts), other context lengths, and run
later. Every decision of the scheduler is a ratio of expected tokens to these times:
a curve that is too flat between 16 and 32 tokens makes it verify tokens at sixteen
requests that cost more than they return, and speculation falls below plain decoding.

So every decode step's measured target forward time (and, when it drafted, its
drafting time) corrects the profiled curve where the engine actually runs:

* per measured count of the curve, the log of measured / profiled time, averaged over
  the steps near that count (a step between two counts is shared between them by
  linear weights): a running mean over the first `window` steps, an exponential
  average over about `window` steps after that;
* between and beyond the counts seen recently the log-ratio is interpolated (flat
  outside), so a count the engine has not run keeps the profile's shape relative to
  its observed neighbours;
* the live curve is the profile times that ratio, made non-decreasing by a weighted
  isotonic fit (a count seen once is pooled with neighbours seen often, where a
  running maximum would carry one slow step up to every larger count); a count not
  observed in the last `max_age` steps is forgotten (the machine has changed since),
  and a single step more than
  `clip` times off the current estimate counts as `clip` times (a stall moves the
  curve little; a profile off by more than that is still learned, step by step).

Only the scheduler's view changes: the table's JSON (`raw_ms`, `step_ms`) stays as
profiled, and `version` counts the updates so that cached rates are recomputed.

Every step is observed, but the table the scheduler reads is republished every
`publish_every` steps (every step during the first `window`): the estimates average
over about `window` steps anyway, and a republished table costs the scheduler a
recomputation of its rates. Steps are queued and folded into the curves only when they
are published (the same curves, at a fraction of the cost right after a forward), and
while the engine decodes plain by its speculate_or_plain's call nothing is published at all, so
that a step that speculates nothing costs what a plain step costs.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from .step_time import StepTimeTable, isotonic, load_level


def _neighbours(xs: list[float], x: float) -> list[tuple[int, float]]:
    """The points of ascending `xs` that x lies between and their linear weights; the
    nearest end alone outside them (np.interp's rule, in plain Python: this runs on
    every decode step)."""
    if x <= xs[0]:
        return [(0, 1.0)]
    if x >= xs[-1]:
        return [(len(xs) - 1, 1.0)]
    i = bisect.bisect_left(xs, x)  # xs[i-1] < x <= xs[i]
    w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return [(i - 1, 1.0 - w), (i, w)] if w < 1.0 else [(i, 1.0)]


class LiveCurve:
    """A profiled curve (times at ascending counts) corrected by observations."""

    def __init__(self, counts, base_ms, window: int = 16, max_age: int = 4096, clip: float = 4.0) -> None:
        self.counts = np.asarray(counts, dtype=np.float64)
        self.base_ms = np.asarray(base_ms, dtype=np.float64)
        if self.counts.shape != self.base_ms.shape or self.counts.size == 0:
            raise ValueError("a live curve needs one profiled time per count")
        self.window = window
        self.max_age = max_age
        self.clip = math.log(clip)
        # Observed on every decode step: kept as Python lists, since numpy's per-call cost
        # on arrays of a dozen counts made each observation cost ~0.1 ms (0.4 % of a
        # 16-request step); numpy only where the curve is read (`ratio`, `ms`).
        self._counts = self.counts.tolist()
        self._base = self.base_ms.tolist()
        self.log_ratio = [0.0] * self.counts.size  # [C]
        self.weight = [0.0] * self.counts.size  # observations per count (fractional)
        self.last_seen = [-(10**9)] * self.counts.size
        self.steps = 0
        #: (steps, fresh counts, their log ratios) at the last refresh
        self._estimate: tuple[int, list[float], list[float]] | None = None

    def _log_estimate(self, x: float) -> float:
        """log(ratio()) at x: the fresh counts' log ratios interpolated, flat outside them
        (0 with none); the fresh counts are refreshed every few observations (clipping
        needs a rough estimate only)."""
        if self._estimate is None or self.steps - self._estimate[0] >= 4 or self.steps < self.window:
            fresh = [j for j, (w, seen) in enumerate(zip(self.weight, self.last_seen))
                     if w >= 0.5 and self.steps - seen <= self.max_age]
            self._estimate = (self.steps, [self._counts[j] for j in fresh], [self.log_ratio[j] for j in fresh])
        _, xs, ys = self._estimate
        return sum(w * ys[j] for j, w in _neighbours(xs, x)) if xs else 0.0

    def predicted_base(self, x: float) -> float:
        return sum(w * self._base[j] for j, w in _neighbours(self._counts, float(x)))

    def observe(self, x: float, ms: float) -> None:
        """One measured time `ms` at count `x`."""
        if not (x > 0 and ms > 0 and math.isfinite(ms)):
            return
        x = float(x)
        # the step's log-ratio, limited to `clip` times the current estimate at x (so a
        # stall moves the curve little, and a profile off by more still gets learned)
        current = self._log_estimate(x)
        residual = math.log(ms / self.predicted_base(x)) - current
        r = current + min(max(residual, -self.clip), self.clip)
        for j, w in _neighbours(self._counts, x):
            if w <= 0:
                continue
            self.weight[j] += w
            a = max(w / self.weight[j], w / self.window)
            self.log_ratio[j] += a * (r - self.log_ratio[j])
            self.last_seen[j] = self.steps
        self.steps += 1

    def fresh(self) -> np.ndarray:
        """Counts observed recently (at least half a step's weight, within `max_age`)."""
        return (np.asarray(self.weight) >= 0.5) & (self.steps - np.asarray(self.last_seen) <= self.max_age)

    def ratio(self) -> np.ndarray:
        """measured / profiled at every count (1 where nothing was observed)."""
        fresh = self.fresh()
        if not fresh.any():
            return np.ones(self.counts.size)
        return np.exp(np.interp(self.counts, self.counts[fresh], np.asarray(self.log_ratio)[fresh]))

    def ms(self) -> np.ndarray:
        """The live curve: profiled times times the ratio, made non-decreasing by a fit
        weighted by how often each count was observed (`isotonic`): one slow step at a
        count seen once does not raise the counts above it that were seen many times."""
        # a count not observed lately holds an interpolated ratio: it weighs little
        weights = 0.1 + np.where(self.fresh(), np.minimum(np.asarray(self.weight), self.window), 0.0)
        return isotonic(self.base_ms * self.ratio(), weights)


class LiveStepTime:
    """Keeps a StepTimeTable's target (and drafter) curve true to the engine's own steps.

    `record` takes one decode step: the tokens of its target forward and how long that
    forward took, and the requests drafted for and how long drafting took (0 when the
    step did not draft). Steps that also prefilled prompt chunks are not recorded by
    the engine (a prompt's tokens cost more than a verification's)."""

    #: unpublished steps folded into the curves at once (bounds the queue's memory)
    QUEUE_LIMIT = 256

    def __init__(self, table: StepTimeTable, window: int = 16, max_age: int = 4096, publish_every: int = 8) -> None:
        self.table = table
        self.publish_every = max(1, publish_every)
        self._unpublished = 0  # records since the table was last republished
        self._drafted = False  # the drafter's curve learned something since then
        self.target = LiveCurve(table.token_counts, table.step_ms, window, max_age)
        d = table.drafter
        self.drafter = None if d is None else LiveCurve(d.request_counts, d.step_ms, window, max_age)
        self.steps = 0
        self.window = window
        self._queue: list[tuple[int, float, int, float]] = []  # steps recorded, not folded yet
        self._outside: dict[int, list] = {}  # level -> averages (seconds; see record_outside)

    def record(self, n_tokens: int, target_seconds: float, drafted_requests: int = 0,
               draft_seconds: float = 0.0, publish: bool = True) -> None:
        """One decode step. It is queued, and the queue is folded into the curves just
        before they are published: the table reads the same curves as if every step
        had been folded at once, but most steps pay for an append. (Folding each step
        cost 35-130 us: the first Python after a forward runs on caches the forward's
        weights have just swept, and a batch pays that once.)

        `publish=False`: nothing reads the table until the caller publishes (plain
        decoding by its speculate_or_plain's call; the engine publishes when speculation resumes),
        so the step is queued and folded, unpublished, every `QUEUE_LIMIT` steps."""
        if n_tokens <= 0 or target_seconds <= 0:
            return
        self._queue.append((n_tokens, target_seconds, drafted_requests, draft_seconds))
        self.steps += 1
        self._unpublished += 1
        if not publish:
            if len(self._queue) >= self.QUEUE_LIMIT:
                self.fold()
        elif self._unpublished >= self.publish_every or self.steps <= self.window:
            self.publish()

    def fold(self) -> None:
        """The queued steps into the curves."""
        for n_tokens, target_seconds, drafted_requests, draft_seconds in self._queue:
            self.target.observe(n_tokens, target_seconds * 1000.0)
            if self.drafter is not None and drafted_requests > 0 and draft_seconds > 0:
                self.drafter.observe(drafted_requests, draft_seconds * 1000.0)
                self._drafted = True
        self._queue.clear()

    def publish(self) -> None:
        """Hand the current curves to the table."""
        self.fold()
        self._unpublished = 0
        if self.target.steps:
            self.table.set_live_ms(self.target.ms(), self.drafter.ms() if self._drafted else None)
            self._drafted = False

    def record_outside(self, n_requests: int, speculated: bool, seconds: float, select_seconds: float = 0.0,
                       drafted: bool = False, catchup_seconds: float = 0.0) -> None:
        """One decode step's time outside the target's forward and the drafter's call,
        whether it speculated (drafted or looked up) and drafted, and of that time what
        choosing the tokens took (lookup, the policy, merging drafts) and the drafter's
        catch-up on the context it skipped. Per load level (the requests' bit length),
        exponential averages over about `window` steps.

        The table's `spec_overhead` is what a speculative step spends there beyond a
        plain one: a step that only looked up, where the drafter also skips steps
        (hybrid drafting), and the catch-up spread over every speculative step (it
        covers the tokens of the steps that skipped, whenever the drafter runs again:
        a cost of keeping the drafter, not of this step's drafting). Its
        `draft_overhead` is what a drafting step spends beyond that, catch-up aside
        (checking, merging and pricing drafts, verifying their distributions): the
        drafter's call does not time it, and it is the drafter's to pay. A level
        without plain steps of its own compares with the nearest level below; with
        none anywhere (every step looked up), a plain step is taken to cost what a
        speculative one did without its choosing."""
        if n_requests <= 0 or seconds < 0:
            return
        level = load_level(n_requests)
        # plain, speculative without drafting, choosing, records, drafting (catch-up
        # aside), catch-up per speculative step
        avg = self._outside.setdefault(level, [None, None, None, 0, None, None])

        def update(i: int, x: float) -> None:
            avg[i] = x if avg[i] is None else avg[i] + (min(x, 4.0 * avg[i] + 1e-3) - avg[i]) / self.window

        if speculated:
            catchup = max(0.0, catchup_seconds) if drafted else 0.0
            update(4 if drafted else 1, seconds - catchup)
            update(5, catchup)
            update(2, max(0.0, select_seconds))
        else:
            update(0, seconds)
        spec = avg[1] if avg[1] is not None else avg[4]
        if spec is None:
            return
        plain = avg[0]
        if plain is None:
            lower = [lv for lv, a in self._outside.items() if lv < level and a[0] is not None]
            plain = self._outside[max(lower)][0] if lower else spec - avg[2]
        avg[3] += 1
        if avg[3] % self.publish_every == 0 or avg[3] <= self.window:
            self.table.set_spec_overhead(n_requests, spec + avg[5] - plain)
            if avg[1] is not None and avg[4] is not None:
                self.table.set_draft_overhead(n_requests, avg[4] - avg[1])

    def summary(self) -> dict:
        """The live curve against the profile, for metrics and the live view (as of the
        last publication: at most `publish_every` steps behind)."""
        levels = {f"{2 ** (lv - 1)}-{2 ** lv - 1}": 2 ** (lv - 1) for lv in sorted(self._outside)}
        out = {"steps": self.steps, "token_counts": self.table.token_counts,
               "profiled_ms": [round(float(x), 3) for x in self.target.base_ms],
               "live_ms": [round(float(x), 3) for x in self.target.ms()],
               "observed": self.target.fresh().tolist(),
               "spec_overhead_ms": {k: round(self.table.spec_overhead(n) * 1000, 3) for k, n in levels.items()},
               "draft_overhead_ms": {k: round(self.table.draft_overhead(n) * 1000, 3) for k, n in levels.items()}}
        if self.drafter is not None:
            out["drafter"] = {"request_counts": [int(c) for c in self.drafter.counts],
                              "profiled_ms": [round(float(x), 3) for x in self.drafter.base_ms],
                              "live_ms": [round(float(x), 3) for x in self.drafter.ms()]}
        return out
