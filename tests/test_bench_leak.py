"""The timing-attack harness's scoring (dspark.bench.leak): its AUC against a direct
count over pairs, and the verdict's three outcomes."""

from __future__ import annotations

import random

from dspark.bench.leak import LeakResult, Probe, auc, verdict


def _pairs_auc(pos: list[float], neg: list[float]) -> float:
    above = ties = 0
    for p in pos:
        for n in neg:
            above += p > n
            ties += p == n
    return (above + ties / 2) / (len(pos) * len(neg))


def test_auc_is_the_mann_whitney_probability_and_symmetric_in_direction():
    rng = random.Random(3)
    pos = [rng.choice([0.1, 0.2, 0.3]) + rng.random() for _ in range(40)]
    neg = [rng.choice([0.1, 0.2, 0.3]) + rng.random() * 0.8 for _ in range(35)] + [pos[0], pos[1]]
    assert auc(pos, neg) == _pairs_auc(pos, neg)
    assert auc([2.0, 3.0], [0.0, 1.0]) == 1.0 and auc([0.0], [1.0]) == 0.0 and auc([1.0], [1.0]) == 0.5
    r = LeakResult("x", [Probe("true", 0.1, 1.0, 1.0), Probe("control", 0.2, 1.0, 1.0)])
    assert r.auc("ttft_s") == 1.0  # faster true probes: a leak, whichever way it points
    assert r.auc("per_token_s") == 0.5


def _result(condition: str, separated: bool) -> LeakResult:
    probes = [Probe("true", 0.1 if separated else 0.2 + i, 1.0, 1.0) for i in range(5)]
    probes += [Probe("control", 0.2 + i, 1.0, 1.0) for i in range(5)]
    return LeakResult(condition, probes)


def test_a_run_passes_only_when_the_control_sees_the_leak_and_nothing_crosses():
    assert verdict([_result("across namespaces", False), _result("same namespace", True)]) == "pass"
    assert verdict([_result("across namespaces", True), _result("same namespace", True)]) == "fail"
    assert verdict([_result("across namespaces", False), _result("same namespace", False)]) == "inconclusive"
