"""The timing-attack harness (dspark.bench.leak): its AUC against a direct count over
pairs, its verdicts, its schedule (a victim's request of its own right before every
pair; a pair's four probes, two conditions by two kinds, in a random order on one
cut), and the whole
protocol against a simulated server whose stores are keyed by namespace (the control
sees both leaks, nothing crosses, even with a prefix cache of a few entries) or shared
(the harness fails it)."""

from __future__ import annotations

import random
from collections import OrderedDict

from dspark.bench.leak import (CHATML, CONDITIONS, FEATURES, PLAIN, LeakConfig, LeakResult, Probe, auc, cut,
                               pair_schedule, parse_counters, run_leak, secret_text, verdict)


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


def _result(condition: str, prefix: bool, history: bool) -> LeakResult:
    """Five probes of each kind; true probes start sooner where `prefix`, and come in
    larger chunks where `history`."""
    probes = [Probe("true", 0.1 if prefix else 0.2 + i, 1.0, 4.0 if history else 1.0 + i / 10) for i in range(5)]
    probes += [Probe("control", 0.2 + i, 1.0, 1.0 + i / 10) for i in range(5)]
    return LeakResult(condition, probes)


def test_a_run_passes_only_when_the_control_sees_both_leaks_and_nothing_crosses():
    clean, leaky = _result("across namespaces", False, False), _result("across namespaces", True, True)
    control = _result("same namespace", True, True)
    assert verdict([clean, control]) == "pass"
    assert verdict([leaky, control]) == "fail"
    assert verdict([_result("across namespaces", False, True), control]) == "fail"  # one feature is enough
    assert verdict([clean, _result("same namespace", False, False)]) == "inconclusive"
    # the control saw the prefix cache's leak but not the history's: that store was not tested
    assert verdict([clean, _result("same namespace", True, False)]) == "inconclusive"
    assert verdict([clean, _result("same namespace", False, True)]) == "inconclusive"


def test_the_schedule_probes_every_pair_once_in_both_conditions_and_both_orders():
    schedule = pair_schedule(40, random.Random(1))
    assert sorted(i for i, _, _ in schedule) == list(range(40))
    assert [i for i, _, _ in schedule] != list(range(40))  # pairs in a random order
    every = sorted((c, k) for c in CONDITIONS for k in ("true", "control"))
    firsts = set()
    for _, probes, fraction in schedule:
        assert sorted(probes) == every
        assert 1 / 3 <= fraction <= 1 / 2
        firsts.add(probes[0])
    assert len(firsts) == 4  # any of the four may go first


def test_prompts_and_cuts():
    rng = random.Random(0)
    a, b = secret_text(rng), secret_text(rng)
    assert a != b and a.startswith(CHATML.split("{request}")[0]) and a.endswith(CHATML.split("{request}")[1])
    request = secret_text(random.Random(0), PLAIN)
    assert request in a and len(request.split()) >= 40  # with the chat frame, over 64 tokens
    words = "one two three four five six seven eight nine ten".split()
    assert cut(" ".join(words), 0.4) == "one two three four"
    assert cut("single", 0.1) == "single"


def test_counters_from_prometheus_text():
    text = "\n".join([
        "# HELP dspark:prefix_cache_hits_total Prompt tokens ...",
        'dspark:prefix_cache_hits_total{model_name="m"} 71.0',
        'dspark:spec_decode_num_draft_tokens_total{model_name="m"} 15.0',
        'dspark:spec_decode_num_accepted_tokens_total{model_name="m"} 12.0',
        'dspark:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 9.0',
        'dspark:prefix_cache_hits_created{model_name="m"} 1.7e9',
        "spec_decode_num_draft_tokens_total 5",
    ])
    assert parse_counters(text) == {"prefix_hit_tokens": 71.0, "draft_tokens": 20.0, "accepted_tokens": 12.0}


class SimulatedServer:
    """The harness's Client against a simulated server: a prefix cache of `entries`
    prompts (one LRU order for all) and a reply history, both keyed by (key, salt)
    unless `shared`. A prompt that begins with a kept one starts sooner; a prompt whose
    last word a kept reply continues comes in chunks of 4 tokens instead of 1. Every
    timing carries noise."""

    def __init__(self, entries: int, shared: bool = False, seed: int = 0) -> None:
        self.entries, self.shared = entries, shared
        self.prefixes: OrderedDict = OrderedDict()
        self.replies: dict = {}
        self.rng = random.Random(seed)
        self.calls: list[tuple] = []
        self.hits = 0

    def _space(self, key: str, salt: str | None):
        return None if self.shared else (key, salt)

    def _answer(self, prompt: str, n: int) -> str:
        r = random.Random(prompt)
        return " ".join(f"w{r.randrange(10**6)}" for _ in range(n))

    def _keep(self, space, prompt: str) -> None:
        self.prefixes[(space, prompt)] = True
        self.prefixes.move_to_end((space, prompt))
        while len(self.prefixes) > self.entries:
            self.prefixes.popitem(last=False)

    def _hit(self, space, prompt: str) -> bool:
        for s, kept in self.prefixes:
            if s == space and prompt.startswith(kept):
                self.prefixes.move_to_end((s, kept))
                return True
        return False

    def reply(self, prompt: str, key: str, salt: str | None, max_tokens: int) -> str:
        self.calls.append(("reply", key, salt, prompt, max_tokens))
        space = self._space(key, salt)
        self._hit(space, prompt)
        self._keep(space, prompt)
        text = self._answer(prompt, max_tokens)
        if max_tokens >= 8:
            self.replies.setdefault(space, []).append(text)
        return text

    def counters(self, key: str) -> dict[str, float]:
        return {"prefix_hit_tokens": float(self.hits), "draft_tokens": 0.0, "accepted_tokens": 0.0}

    def timed(self, prompt: str, key: str, salt: str | None, max_tokens: int, kind: str) -> Probe:
        self.calls.append(("timed", key, salt, prompt, kind))
        space = self._space(key, salt)
        hit = self._hit(space, prompt)
        self.hits += 100 * hit
        self._keep(space, prompt)
        tail = prompt.split(" ")[-1]
        drafted = any(tail in r.split(" ")[:-1] for r in self.replies.get(space, []))  # a reply goes on
        noise = lambda: self.rng.uniform(0, 0.02)  # noqa: E731
        return Probe(kind, (0.03 if hit else 0.3) + noise(), 0.02 + noise(), (4.0 if drafted else 1.0) + noise())


def test_the_control_sees_both_leaks_with_a_cache_of_six_prompts_and_nothing_crosses():
    server = SimulatedServer(entries=6)
    cfg = LeakConfig("v", "a", probes=30, probe_tokens=8, reply_tokens=40, seed=2)
    results = run_leak(server, cfg, log=lambda line: None)
    by = {r.condition: r for r in results}
    assert [len(by[c].probes) for c in CONDITIONS] == [60, 60]
    assert all(by["same namespace"].auc(f) == 1.0 for f in ("ttft_s", "tokens_per_chunk"))
    assert all(by["across namespaces"].auc(f) <= 0.7 for f in FEATURES)
    assert verdict(results) in ("pass", "fail")  # conclusive; across, only noise separates
    assert by["across namespaces"].probes[0].counters == {"prefix_hit_tokens": 0.0, "draft_tokens": 0.0,
                                                          "accepted_tokens": 0.0}
    # the victim's request (a full reply, a secret of its own) right before every pair's four probes
    timed_runs = [i for i, c in enumerate(server.calls) if c[0] == "timed"]
    starts = timed_runs[::4]
    assert len(starts) == 30
    secrets = set()
    for s in starts:
        call = server.calls[s - 1]
        assert call[:3] == ("reply", "v", None) and call[4] == 40
        trues = [c for c in server.calls[s:s + 4] if c[4] == "true"]
        assert len(trues) == 2 and all(c[3].startswith(call[3]) and len(c[3]) > len(call[3]) for c in trues)
        secrets.add(call[3])
    assert len(secrets) == 30  # as varied as the controls
    # across namespaces: the attacker's key, never the same salt twice; the control: the victim's key and salt
    across = [c for c in server.calls if c[0] == "timed" and c[1] == "a"]
    assert len(across) == 60 and len({c[2] for c in across}) == 60
    assert all(c[2] is None for c in server.calls if c[0] == "timed" and c[1] == "v")


def test_a_cache_smaller_than_a_pair_hides_the_prefix_leak_from_the_control():
    """What the victim's request right before its pair is for, and its bound: a pair
    stores up to five prompts (the victim's and four probes'), so a cache of six keeps
    the victim's entry through the pair; one of two loses it before some true probes."""
    results = run_leak(SimulatedServer(entries=2), LeakConfig("v", "a", probes=30, probe_tokens=8, reply_tokens=40,
                                                              seed=2), log=lambda line: None)
    by = {r.condition: r for r in results}
    assert by["same namespace"].auc("ttft_s") < 0.9
    assert verdict(results) == "inconclusive"


def test_a_shared_store_fails_the_run():
    results = run_leak(SimulatedServer(entries=6, shared=True),
                       LeakConfig("v", "a", probes=20, probe_tokens=8, reply_tokens=40, seed=4), log=lambda line: None)
    by = {r.condition: r for r in results}
    assert by["across namespaces"].auc("ttft_s") > 0.9  # each control has its own decoy
    # the decoys' replies are kept too, but end where their probes begin: nothing to draft
    assert by["across namespaces"].auc("tokens_per_chunk") == 1.0
    assert verdict(results) == "fail"
