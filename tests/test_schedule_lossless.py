"""The losslessness trap of the paper's Appendix A as a statistical test: a policy
whose verification length reads the current draft biases the output distribution;
the shipped policies keep the target's."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dspark.schedule import ConfidenceThreshold, DSparkAsync, DSparkSync, FixedLength

from test_schedule import RetrospectiveSearch, table_from_seconds

# -- the losslessness trap (paper App. A) ---------------------------------------------
#
# One request, two drafted tokens, vocabulary {A=0, B=1}. The drafter samples d1 from
# q1 with confidence c1 = 0.8 (= sum min(p1, q1), so it is calibrated), then d2 from
# q2(. | d1) with c2 = 0.9 after A and 0.1 after B (again sum min(p2, q2)). "Rate" is the
# paper's throughput denominator r(n) = 1 / T(n): J = expected tokens * r(n), so a table
# with T(n) = 1 / r(n) seconds reproduces its numbers. With rates 1.0 / 0.5 / 0.45:
#   J(L=0) = 1, J(L=1) = 1.8 * 0.5 = 0.9, J(L=2) = (1.8 + 0.8 c2) * 0.45
#   = 1.134 after A, 0.846 after B.
# Algorithm 1 stops at L=1's drop, so it never speculates here; the whole-table search
# verifies both tokens when d1 = A and none when d1 = B, which lets d1 decide whether it
# is verified at all. Its first token is A with probability
#   q1(B) p1(A) + q1(A) min(1, p1(A) / q1(A)) = 0.4 * 0.4 + 0.6 * 2/3 = 0.56, not p1(A) = 0.4.

Q1 = (0.6, 0.4)
P1 = (0.4, 0.6)
Q2 = {0: (0.8, 0.2), 1: (0.95, 0.05)}  # drafter, given d1
P2 = {0: (0.7, 0.3), 1: (0.05, 0.95)}  # target, given the first emitted token
C1, C2 = 0.8, {0: 0.9, 1: 0.1}
APPENDIX_A_TABLE = table_from_seconds([1 / 1.0, 1 / 0.5, 1 / 0.45])
# here Algorithm 1 verifies d1 always and d2 only after A: it legitimately reads c2
VERIFY_SOME_TABLE = table_from_seconds([1.0, 1.1, 1.5])
ROUNDS = 40_000


def draw(rng: np.random.Generator, dist: tuple[float, float]) -> int:
    return 0 if rng.random() < dist[0] else 1  # rng.random() is a float64 uniform


def target_next(prefix: list[int]) -> tuple[float, float]:
    return P1 if not prefix else P2[prefix[0]]


def play_round(rng: np.random.Generator, policy, survival: dict[int, np.ndarray]) -> tuple[int, int, int]:
    """One speculative round, then plain target sampling up to two tokens.
    Returns (first token, second token, L)."""
    d1 = draw(rng, Q1)
    d2 = draw(rng, Q2[d1])
    length = policy.choose(survival[d1])[0]
    drafts, draft_dists = [d1, d2][:length], [Q1, Q2[d1]]
    emitted: list[int] = []
    for k, token in enumerate(drafts):
        p, q = target_next(emitted), draft_dists[k]
        if rng.random() < min(1.0, p[token] / q[token]):
            emitted.append(token)
            continue
        residual = [max(0.0, p[x] - q[x]) for x in (0, 1)]
        emitted.append(draw(rng, (residual[0] / sum(residual), residual[1] / sum(residual))))
        break
    else:
        emitted.append(draw(rng, target_next(emitted)))  # bonus, or plain decoding when L = 0
    while len(emitted) < 2:
        emitted.append(draw(rng, target_next(emitted)))
    return emitted[0], emitted[1], length


def simulate(policy, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Counts of (first, second) emitted token [2, 2] and of L [3] over ROUNDS rounds."""
    rng = np.random.default_rng(seed)
    survival = {d1: np.array([[C1, C1 * C2[d1]]]) for d1 in (0, 1)}
    joint, lengths = np.zeros((2, 2), dtype=np.int64), np.zeros(3, dtype=np.int64)
    for _ in range(ROUNDS):
        first, second, length = play_round(rng, policy, survival)
        joint[first, second] += 1
        lengths[length] += 1
    return joint, lengths


def chi_square_p_value(joint: np.ndarray) -> float:
    """Goodness of fit of the 4 cells to p1(x1) p2(x2 | x1); 3 degrees of freedom."""
    expected = ROUNDS * np.array([[P1[a] * P2[a][b] for b in (0, 1)] for a in (0, 1)])
    stat = float(((joint - expected) ** 2 / expected).sum())
    return math.erfc(math.sqrt(stat / 2)) + math.sqrt(2 * stat / math.pi) * math.exp(-stat / 2)


def first_token_tv(joint: np.ndarray) -> float:
    return abs(joint[0].sum() / ROUNDS - P1[0])


def test_whole_table_search_biases_the_first_token():
    joint, lengths = simulate(RetrospectiveSearch(APPENDIX_A_TABLE), seed=11)
    assert lengths[1] == 0 and lengths[0] > 0 and lengths[2] > 0  # L = 2 after A, L = 0 after B
    assert joint[0].sum() / ROUNDS == pytest.approx(0.56, abs=0.015)
    assert first_token_tv(joint) > 0.1
    assert chi_square_p_value(joint) < 1e-9


@pytest.mark.parametrize(
    "make, table, seed, used",
    [
        (lambda t: DSparkSync(t), APPENDIX_A_TABLE, 12, {0}),
        (lambda t: DSparkAsync(t, lag=2), APPENDIX_A_TABLE, 13, {0, 2}),
        (lambda t: ConfidenceThreshold(0.5), APPENDIX_A_TABLE, 14, {1, 2}),
        (lambda t: FixedLength(2), APPENDIX_A_TABLE, 15, {2}),
        (lambda t: DSparkSync(t), VERIFY_SOME_TABLE, 16, {1, 2}),
        (lambda t: DSparkAsync(t, lag=2), VERIFY_SOME_TABLE, 17, {1, 2}),
    ],
    ids=["sync", "async", "threshold", "fixed", "sync-reads-c2", "async-verify-some"],
)
def test_lossless_policies_keep_the_target_distribution(make, table, seed, used):
    joint, lengths = simulate(make(table), seed=seed)
    assert set(np.flatnonzero(lengths).tolist()) == used
    assert first_token_tv(joint) < 0.015
    assert chi_square_p_value(joint) > 1e-3
