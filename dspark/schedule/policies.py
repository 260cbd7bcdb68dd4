"""Verification-length policies: survival probabilities (+ a step-time table) in,
one verification length per request out.

Glossary, for a batch of R requests that each drafted G tokens:

* c_{i,k}: the drafter's confidence that drafted token k of request i is accepted
  given that tokens 1..k-1 were; it depends on the drafted token k-1 (the Markov
  input) but not on token k itself;
* survival s_{i,k} = c_{i,1} * ... * c_{i,k}: the probability that the first k
  drafted tokens are all accepted; non-increasing in k;
* verification length L_i in 0..G: the engine sends [anchor, d_1..d_{L_i}] to the
  target, n = sum_i (1 + L_i) tokens, and expects sum_i (1 + sum_{k<=L_i} s_{i,k})
  tokens back (the accepted drafts plus one bonus/recovered token each).

Losslessness. Speculative sampling emits exactly the target's distribution for any
verification length that is fixed before the draft is sampled. A length chosen from
the draft stays lossless as long as the decision "verify position k" (L_i >= k)
depends only on what was known before d_{i,k} was sampled: s_{i,1..k}, other
requests' drafts, and the past. Given that d_1..d_{k-1} were accepted, the token
emitted at k is target-distributed whether d_k is verified or sampled from p as the
bonus; but if the choice between the two depends on d_k (for instance through
c_{k+1}, which is computed from d_k), the mix of the two cases is weighted by d_k and
is no longer p. Every policy here honours that rule.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .step_time import ScheduleError, StepTimeTable
from .survival import SMALL_TABLE, SurvivalLike, admission_order, admission_order_rows, as_survival, lengths_from, \
    lengths_from_rows, shape_of, small_survival_rows

POLICY_NAMES = ("none", "fixed", "threshold", "dspark-sync", "dspark-async")


class VerifyLengthPolicy:
    """Picks L_i for every request of a step. `choose` is called once per decode step
    with the [R, G] survival matrix of that step's drafts.

    The same forward may carry more: `others` requests that verify nothing (left out
    of drafting and lookup: one token in, one out each) and `other_tokens` tokens of
    prompt chunks. The policies that price tokens by step time (those with a `table`)
    take both as further arguments of `choose`, and price the whole step:
    a drafted token costs what it adds to a forward of all of them, not to a forward
    of the R requests alone (on a curve that is flat up to 8 tokens and steep after
    16, pricing 8 looked-up requests of a 16-request step at T(8 + B) made their
    tokens look nearly free, and speculation ran 0.85x plain at 16 requests)."""

    name: str = ""
    #: True when the last `should_draft` said yes only to re-measure survival (the
    #: engine then drafts a few requests, not all); only dspark-async probes
    probing: bool = False
    #: False for policies that only read the shape of `survival`; a drafter without a
    #: confidence head may then pass any [R, G] array (e.g. `torch.empty(R, G)`).
    needs_confidence: bool = True

    def choose(self, survival: SurvivalLike) -> list[int]:
        raise NotImplementedError

    def should_draft(self, num_requests: int, num_drafted: int) -> bool:
        """Whether to run the drafter at all this step, decided BEFORE drafting (so
        from past steps only, which keeps it lossless). False means every request
        verifies 0 tokens and the drafter's cost is saved."""
        return True

    def reset(self) -> None:
        """Forget any state carried between steps."""


class NoSpeculation(VerifyLengthPolicy):
    """Verify nothing: plain decoding, one target token per request per step."""

    name = "none"
    needs_confidence = False

    def choose(self, survival: SurvivalLike) -> list[int]:
        num_requests, _ = shape_of(survival)
        return [0] * num_requests


class FixedLength(VerifyLengthPolicy):
    """Verify min(gamma, G) tokens for every request; gamma=None verifies all G."""

    name = "fixed"
    needs_confidence = False

    def __init__(self, gamma: int | None = None) -> None:
        if gamma is not None and (not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 0):
            raise ScheduleError(f"the fixed verification length must be a non-negative integer, got {gamma!r}")
        self.gamma = gamma

    def choose(self, survival: SurvivalLike) -> list[int]:
        num_requests, num_drafted = shape_of(survival)
        length = num_drafted if self.gamma is None else min(self.gamma, num_drafted)
        return [length] * num_requests


class ConfidenceThreshold(VerifyLengthPolicy):
    """Verify every drafted token whose *survival* s_{i,k} (not its per-token
    confidence c_{i,k}) is at least `tau`: L_i = #{k : s_{i,k} >= tau}.

    Thresholding survival gives tau one meaning at every position, the probability
    that the token is reached and accepted; because survival is non-increasing this
    is always a prefix, and it is lossless since s_{i,k} is known before d_{i,k} is
    sampled. tau = 0 verifies everything, tau = 1 only tokens that are certain.
    """

    name = "threshold"

    def __init__(self, tau: float) -> None:
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0.0 <= tau <= 1.0:
            raise ScheduleError(f"the confidence threshold must be a probability in [0, 1], got {tau!r}")
        self.tau = float(tau)

    def choose(self, survival: SurvivalLike) -> list[int]:
        s = as_survival(survival)  # [R, G]
        return (s >= self.tau).sum(axis=1).tolist()


def _check_table(table: object, policy: str) -> StepTimeTable:
    if not isinstance(table, StepTimeTable):
        raise ScheduleError(
            f"policy {policy!r} needs a step-time table (measure one with `dspark profile`), got {table!r}"
        )
    return table


class DSparkSync(VerifyLengthPolicy):
    """The paper's Algorithm 1: a greedy that admits drafted tokens in order of
    survival and stops at the first one that does not raise the expected throughput

        J = (sum_i 1 + sum_{k<=L_i} s_{i,k}) / step_time(sum_i (1 + L_i), R).

    (Here and in `DSparkAsync` and `free_lengths`, a step that verifies any drafted
    token also pays the table's measured `spec_overhead`: the time speculation costs
    outside the target and the drafter, which decides whether a token or two are worth
    verifying at all.)

    The early stop is what keeps it lossless, not a shortcut. c_{i,k+1} is computed
    from the sampled token d_{i,k}, so a scheduler that scans the whole table and
    picks the best prefix afterwards lets a later, low J (which contains s_{i,k+1})
    decide whether d_{i,k} itself, or even d_{i,1} versus no speculation at all, is
    verified: a future token leaks into the admission of an earlier one and biases
    the output distribution (paper §3.2.2 and App. A). Stopping at the first drop
    decides on entry (i, k) from entries of at least its survival only, which for
    request i are s_{i,1..k}. Step-time curves are jagged, so this may stop before
    the best prefix; `DSparkAsync` recovers that without the leak.
    """

    name = "dspark-sync"

    def __init__(self, table: StepTimeTable) -> None:
        self.table = _check_table(table, self.name)

    def choose(self, survival: SurvivalLike, others: int = 0, other_tokens: int = 0) -> list[int]:
        s = as_survival(survival)  # [R, G]
        num_requests, num_drafted = s.shape
        if num_requests == 0 or num_drafted == 0:
            return [0] * num_requests
        rows, gains = admission_order(s)  # [R*G], [R*G]
        expected = num_requests + others + np.concatenate(([0.0], np.cumsum(gains)))  # [R*G+1]
        n_tokens = num_requests + others + other_tokens + np.arange(gains.size + 1)  # [R*G+1]
        rate = expected / self.table.admission_times(n_tokens, num_requests, others=others,
                                                     other_tokens=other_tokens)  # [R*G+1]
        # J is evaluated at every prefix at once, but only the first drop decides
        improves = rate[1:] > rate[:-1]  # [R*G]
        num_admitted = gains.size if improves.all() else int(improves.argmin())
        return lengths_from(rows, num_admitted, num_requests)


class DSparkAsync(VerifyLengthPolicy):
    """The paper's asynchronous scheduler: a token budget B from the survivals of
    `lag` steps ago, then the current step's top-B entries.

    B maximises expected/step_time over the WHOLE table (every B in 0..R*G, since a
    jagged step-time curve has several local maxima), computed from the survivals
    of step t - lag. The current step then verifies the B entries (i, k) of highest
    current survival, lower k first on ties, which is a set of per-request prefixes.
    Lossless: B does not depend on the current draft at all, and whether (i, k) is
    among the top B depends on s_{i,1..k} and on other requests only.

    The batch changes between steps as requests join and leave, so the lagged step
    is summarised per request: g(x) is its expected accepted drafts per request when
    its best x * R' entries are verified (R' its request count, x tokens per request,
    linear between entries). For the current R requests the budget search uses
    expected(B) = R * (1 + g(B / R)), i.e. the lagged step's survival profile scaled
    to the current batch; with an unchanged batch this is exactly its top-B sum.

    Until `lag` steps have been seen, the budget is `warmup_length` tokens per request
    (the plain fixed-length behaviour) or, with `warmup_length` None, priced as above
    on a prior profile in place of the lagged step: survival `WARMUP_SURVIVAL`**k at
    position k (about what the drafters accept; verifying every drafted token of a
    first step of sixteen requests would cost several plain steps). Steps without
    requests or drafts are not recorded. `last_budget` is the B of the latest step.

    Skipping the drafter. Drafting itself costs time (the table's drafter curve). When
    the lagged survivals say that the best budget does not pay for it, i.e. plain
    decoding R / target_time(R) beats every expected(B) / (target_time(R + B) +
    drafter_time(R)), `should_draft` returns False and the step runs without a
    draft. The `probe_every`-th step in a row that would be skipped drafts anyway,
    to refresh the survivals the decision rests on (0 never skips); while probes
    keep finding that drafting does not pay, the gap between them doubles, up to
    8 x probe_every, and it is back to probe_every once drafting pays. A probe step
    sets `probing`, and the engine drafts it for a few requests only. Both decisions
    use past steps only, so they are lossless like the budget.
    """

    name = "dspark-async"

    #: the prior per-position acceptance behind the first `lag` steps' budgets
    WARMUP_SURVIVAL = 0.5

    def __init__(
        self, table: StepTimeTable, lag: int = 2, warmup_length: int | None = None, probe_every: int = 8
    ) -> None:
        self.table = _check_table(table, self.name)
        if isinstance(probe_every, bool) or not isinstance(probe_every, int) or probe_every < 0:
            raise ScheduleError(f"probe_every must be a non-negative integer, got {probe_every!r}")
        self.probe_every = probe_every
        self._probe_gap = probe_every
        self._skipped = 0
        self.skipped_steps = 0
        self._rates_cache: tuple[tuple, tuple, list[float]] | None = None
        if isinstance(lag, bool) or not isinstance(lag, int) or lag < 1:
            raise ScheduleError(
                f"lag must be an integer >= 1, got {lag!r}: a budget from the current step's "
                "own survivals would leak its draft into admission (use dspark-sync instead)"
            )
        if warmup_length is not None and (
            isinstance(warmup_length, bool) or not isinstance(warmup_length, int) or warmup_length < 0
        ):
            raise ScheduleError(f"warmup_length must be a non-negative integer or None, got {warmup_length!r}")
        self.lag = lag
        self.warmup_length = warmup_length
        # per recorded step: (cumulative survival per request at 0..R'*G' admitted entries, R')
        self._history: deque[tuple[np.ndarray, int]] = deque(maxlen=lag)
        self.last_budget: int | None = None
        self._prior: tuple[np.ndarray, int] | None = None

    def reset(self) -> None:
        self._history.clear()
        self.last_budget = None
        self._skipped = 0
        self._probe_gap = self.probe_every
        self._rates_cache = None

    def _rates(self, num_requests: int, num_drafted: int, others: int = 0, other_tokens: int = 0) -> list[float]:
        """Expected tokens per second at every budget 0..R*G, drafter cost included,
        from the step `lag` back (which must exist), for a step that also carries
        `others` requests and `other_tokens` prompt tokens. `should_draft` and `budget`
        of one step ask for the same rates; they are computed once."""
        key = (num_requests, num_drafted, others, other_tokens, self.table.version)
        lagged = self._lagged(num_drafted)
        if self._rates_cache is not None and self._rates_cache[0] == key and self._rates_cache[1] is lagged:
            return self._rates_cache[2]
        cum_gain, lagged_requests = lagged  # [R'*G'+1], R'
        if num_requests * num_drafted <= SMALL_TABLE:
            rates = self._rates_small(cum_gain.tolist(), lagged_requests, num_requests, num_drafted, others,
                                      other_tokens)
            self._rates_cache = (key, lagged, rates)
            return rates
        budgets = np.arange(num_requests * num_drafted + 1)  # [R*G+1]
        entries = budgets * (lagged_requests / num_requests)  # lagged entries at B / R per request
        per_request = np.interp(entries, np.arange(cum_gain.size), cum_gain)  # g(B / R)
        expected = num_requests * (1.0 + per_request) + others
        rates = (expected / self.table.admission_times(num_requests + others + other_tokens + budgets, num_requests,
                                                       others=others, other_tokens=other_tokens)).tolist()
        self._rates_cache = (key, lagged, rates)
        return rates

    def _rates_small(self, cum_gain: list[float], lagged_requests: int, num_requests: int, num_drafted: int,
                     others: int, other_tokens: int) -> list[float]:
        """`_rates` in plain Python for a small step (every speculating step asks, right
        after a forward): the same interpolation (np.interp's arithmetic), sums and
        times, so the same numbers."""
        scale = lagged_requests / num_requests
        last = len(cum_gain) - 1
        table = self.table
        rates = []
        for b in range(num_requests * num_drafted + 1):
            x = b * scale
            if x >= last:
                g = cum_gain[last]
            else:
                j = int(x)
                g = cum_gain[j] if x == j else (cum_gain[j + 1] - cum_gain[j]) * (x - j) + cum_gain[j]
            expected = num_requests * (1.0 + g) + others
            rates.append(expected / table.admission_time(num_requests + others + other_tokens + b, num_requests,
                                                         others=others, other_tokens=other_tokens))
        return rates

    def _lagged(self, num_drafted: int) -> tuple[np.ndarray, int]:
        """The step `lag` back, or before there is one, the prior profile of one request."""
        if len(self._history) >= self.lag:
            return self._history[0]
        if self._prior is None or self._prior[0].size != num_drafted + 1:
            gains = self.WARMUP_SURVIVAL ** np.arange(1, num_drafted + 1)
            self._prior = (np.concatenate(([0.0], np.cumsum(gains))), 1)
        return self._prior

    def _warming(self) -> bool:
        return len(self._history) < self.lag and self.warmup_length is not None

    def budget(self, num_requests: int, num_drafted: int, others: int = 0, other_tokens: int = 0) -> int:
        """B for a step of `num_requests` x `num_drafted` (and `others`, `other_tokens`:
        see `VerifyLengthPolicy`), from the step `lag` back."""
        if self._warming():
            return num_requests * min(self.warmup_length, num_drafted)
        rates = self._rates(num_requests, num_drafted, others, other_tokens)
        return rates.index(max(rates))  # first maximum: the cheapest

    def should_draft(self, num_requests: int, num_drafted: int) -> bool:
        self.probing = False
        if self.probe_every == 0 or num_requests == 0 or num_drafted == 0 or len(self._history) < self.lag:
            return True  # the first steps draft: their survivals are what later decisions rest on
        plain = num_requests / self.table.target_time(num_requests)
        if max(self._rates(num_requests, num_drafted)) > plain:
            self._skipped = 0
            self._probe_gap = self.probe_every
            return True
        self._skipped += 1
        if self._skipped >= self._probe_gap:
            self._skipped = 0
            self._probe_gap = min(2 * self._probe_gap, 8 * self.probe_every)
            self.probing = True
            return True
        self.skipped_steps += 1
        return False

    def choose(self, survival: SurvivalLike, others: int = 0, other_tokens: int = 0) -> list[int]:
        small = small_survival_rows(survival)
        if small is not None:
            return self._choose_small(small, others, other_tokens)
        s = as_survival(survival)  # [R, G]
        num_requests, num_drafted = s.shape
        if num_requests == 0 or num_drafted == 0:
            return [0] * num_requests
        budget = self.budget(num_requests, num_drafted, others, other_tokens)
        rows, gains = admission_order(s)
        cum_gain = np.concatenate(([0.0], np.cumsum(gains))) / num_requests  # [R*G+1]
        self._history.append((cum_gain, num_requests))
        self.last_budget = budget
        return lengths_from(rows, budget, num_requests)

    def _choose_small(self, s: list[list[float]], others: int, other_tokens: int) -> list[int]:
        """`choose` of a small table in plain Python (a drafting step's pricing right after
        a forward, where numpy's per-call cost was most of it): the same order, sums and
        budget, so the same lengths and history."""
        num_requests = len(s)
        if num_requests == 0 or not s[0]:
            return [0] * num_requests
        budget = self.budget(num_requests, len(s[0]), others, other_tokens)
        rows, gains = admission_order_rows(s)
        total, cum = 0.0, [0.0]
        for g in gains:  # np.cumsum's running sum, then the division
            total += g
            cum.append(total)
        self._history.append((np.array([c / num_requests for c in cum]), num_requests))
        self.last_budget = budget
        return lengths_from_rows(rows, budget, num_requests)


def make_policy(
    name: str,
    table: StepTimeTable | None = None,
    num_speculative_tokens: int | None = None,
    threshold: float = 0.5,
    lag: int = 2,
    probe_every: int = 8,
    warmup_length: int | None = None,
) -> VerifyLengthPolicy:
    """The policy called `name` (one of POLICY_NAMES).

    num_speculative_tokens: the fixed length for `fixed`. warmup_length: `dspark-async`'s
    tokens per request before it has seen `lag` steps (None: priced on its prior
    profile). threshold: the survival threshold of `threshold`.
    lag: how many steps old the survivals behind `dspark-async`'s budget are.
    probe_every: `dspark-async` skips the drafter while it does not pay and drafts
    every probe_every-th such step anyway (0: never skip).
    The `dspark-*` policies need `table`.
    """
    if name == "none":
        return NoSpeculation()
    if name == "fixed":
        return FixedLength(num_speculative_tokens)
    if name == "threshold":
        return ConfidenceThreshold(threshold)
    if name == "dspark-sync":
        return DSparkSync(_check_table(table, name))
    if name == "dspark-async":
        return DSparkAsync(_check_table(table, name), lag=lag, warmup_length=warmup_length, probe_every=probe_every)
    raise ScheduleError(f"unknown verification policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")
