"""The timing-attack harness: can one tenant tell, from how its own requests run, what
another tenant sent or was answered?

A victim tenant sends a secret prompt and receives a greedy reply; its prompt is now
in the prefix cache and its reply in the reply history, both under the victim's
namespace. An attacker then sends probes: half "true" (the secret prompt followed by
the first j tokens of the victim's reply, so that a shared store would start the
prompt sooner and draft the reply's continuation), half matched controls (a decoy
prompt of the same kind, never sent before, with the first j tokens of its own
reply, obtained beforehand in a throwaway namespace). Probes run one at a time in a
random order, each measured by its stream: time to the first token, time per token
after it, and tokens per chunk. Each feature's AUC says how well it tells a true
probe from a control (0.5: not at all; reported as max(AUC, 1 - AUC), the better of
the two directions an attacker could pick).

Two conditions: across namespaces (the attacker's own key, a fresh salt per probe so
that its probes do not help each other) must give AUC <= 0.6 on every feature; inside
the victim's namespace (the victim's key and salt) some feature must give AUC >= 0.9,
or the run is inconclusive: a harness that cannot see the leak where it exists proves
nothing where it finds none.

HTTP only (no torch): it runs against any server that knows the two keys.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field

import httpx

FEATURES = ("ttft_s", "per_token_s", "tokens_per_chunk")

#: words the secret and decoy prompts are drawn from: ordinary English, so that the
#: model's replies are ordinary text
WORDS = ("river mountain garden letter window morning silver orange quiet forest harbor teacher market "
         "winter lantern village candle bridge summer meadow pocket thunder basket castle mirror planet "
         "ticket doctor engine island jacket kitchen ladder needle pillow rabbit saddle tunnel violin "
         "wagon yellow anchor blanket copper desert feather glacier hammer ivory jungle kettle").split()


@dataclass
class Probe:
    kind: str  # "true" or "control"
    ttft_s: float
    per_token_s: float
    tokens_per_chunk: float


@dataclass
class LeakResult:
    condition: str
    probes: list[Probe] = field(default_factory=list)

    def auc(self, feature: str) -> float:
        """max(AUC, 1 - AUC) of `feature` separating true probes from controls."""
        pos = [getattr(p, feature) for p in self.probes if p.kind == "true"]
        neg = [getattr(p, feature) for p in self.probes if p.kind == "control"]
        a = auc(pos, neg)
        return max(a, 1.0 - a)

    def summary(self) -> dict:
        return {"condition": self.condition, "probes": len(self.probes),
                "auc": {f: round(self.auc(f), 3) for f in FEATURES},
                "medians": {kind: {f: _median([getattr(p, f) for p in self.probes if p.kind == kind])
                                   for f in FEATURES} for kind in ("true", "control")}}


def auc(pos: list[float], neg: list[float]) -> float:
    """P(a positive scores above a negative), ties counting half (Mann-Whitney)."""
    if not pos or not neg:
        raise ValueError("an AUC needs both positives and negatives")
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    m = len(s) // 2
    return round(s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2, 5)


def secret_text(rng: random.Random, words: int = 60) -> str:
    """A prompt of `words` random words (about 70 tokens with the default tokenizer)."""
    return "Write a short story that uses these words in order: " + " ".join(rng.choice(WORDS) for _ in range(words))


class Client:
    """Completions against one server, streamed and timed."""

    def __init__(self, base_url: str, model: str | None = None, timeout: float = 300.0) -> None:
        self.url = base_url.rstrip("/")
        self.model = model
        self.http = httpx.Client(timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def _body(self, prompt: str, max_tokens: int, salt: str | None, stream: bool) -> dict:
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        if self.model:
            body["model"] = self.model
        if salt is not None:
            body["cache_salt"] = salt
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        return body

    def reply(self, prompt: str, key: str, salt: str | None, max_tokens: int) -> str:
        r = self.http.post(self.url + "/v1/completions", json=self._body(prompt, max_tokens, salt, False),
                           headers={"Authorization": f"Bearer {key}"})
        r.raise_for_status()
        return r.json()["choices"][0]["text"]

    def timed(self, prompt: str, key: str, salt: str | None, max_tokens: int, kind: str) -> Probe:
        """One streamed request: (time to first token, seconds per later token, tokens per chunk)."""
        t0 = time.perf_counter()
        arrivals: list[float] = []
        tokens = 0
        with self.http.stream("POST", self.url + "/v1/completions", json=self._body(prompt, max_tokens, salt, True),
                              headers={"Authorization": f"Bearer {key}"}) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
                if event.get("choices") and event["choices"][0].get("text"):
                    arrivals.append(time.perf_counter())
        if len(arrivals) < 2 or tokens < 2:
            raise RuntimeError(f"a probe streamed {len(arrivals)} chunks of {tokens} tokens; raise --probe-tokens")
        return Probe(kind, arrivals[0] - t0, (arrivals[-1] - arrivals[0]) / (tokens - 1), tokens / len(arrivals))


@dataclass
class LeakConfig:
    victim_key: str
    attacker_key: str
    victim_salt: str | None = None
    probes: int = 50  # per kind and condition
    probe_tokens: int = 16
    reply_tokens: int = 48
    seed: int = 0


def run_leak(client: Client, cfg: LeakConfig, log=print) -> list[LeakResult]:
    """The victim's request, the decoys' replies, then both conditions (see the module docstring)."""
    rng = random.Random(cfg.seed)
    secret = secret_text(rng)
    victim_reply = client.reply(secret, cfg.victim_key, cfg.victim_salt, cfg.reply_tokens)
    log(f"victim: {len(secret.split())}-word secret prompt, reply of {cfg.reply_tokens} tokens")
    decoys = []
    for i in range(cfg.probes):
        prompt = secret_text(rng)
        # its reply in a namespace nobody probes, so that a control is as fresh as the secret is to the attacker
        decoys.append((prompt, client.reply(prompt, cfg.attacker_key, f"decoy-{cfg.seed}-{i}", cfg.reply_tokens)))
    log(f"{len(decoys)} decoys and their replies fetched")
    results = []
    for condition, key in (("across namespaces", cfg.attacker_key), ("same namespace", cfg.victim_key)):
        result = LeakResult(condition)
        order = [("true", i) for i in range(cfg.probes)] + [("control", i) for i in range(cfg.probes)]
        rng.shuffle(order)
        for n, (kind, i) in enumerate(order):
            prompt, reply = (secret, victim_reply) if kind == "true" else decoys[i]
            cut = _cut(reply, rng)
            salt = f"probe-{cfg.seed}-{condition[0]}-{n}" if key == cfg.attacker_key else cfg.victim_salt
            result.probes.append(client.timed(prompt + cut, key, salt, cfg.probe_tokens, kind))
        log(json.dumps(result.summary()))
        results.append(result)
    return results


def _cut(reply: str, rng: random.Random) -> str:
    """The reply's first few words (a third to a half of them): the probe's own prompt
    ends inside the reply, so that what follows is the reply's continuation."""
    words = reply.split(" ")
    return " ".join(words[: max(1, rng.randint(len(words) // 3, len(words) // 2))])


def verdict(results: list[LeakResult], cross_max: float = 0.6, control_min: float = 0.9) -> str:
    """'pass', 'fail' (a feature leaks across namespaces) or 'inconclusive' (the control
    saw no leak inside the victim's namespace)."""
    by = {r.condition: r for r in results}
    if max(by["same namespace"].auc(f) for f in FEATURES) < control_min:
        return "inconclusive"
    return "pass" if all(by["across namespaces"].auc(f) <= cross_max for f in FEATURES) else "fail"
