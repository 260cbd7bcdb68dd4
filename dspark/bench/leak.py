"""The timing-attack harness: can one tenant tell, from how its own requests run, what
another tenant sent or was answered?

Before each of `probes` pairs, a victim tenant sends a secret prompt of its own (a
request for a story with random names and things, in the model's chat format: about
85 tokens) and receives a greedy reply of `reply_tokens` (96); its prompt is now the
prefix cache's most recently used entry and its reply the reply history's newest, both
under the victim's namespace. The pair is then probed in two conditions: across
namespaces (the attacker's own key, a fresh salt per probe, so that its probes do not
help each other) and inside the victim's namespace (the victim's key and salt: the
control). A pair is a "true" probe (that secret prompt followed by the first part of
its reply, so that a shared store would start the prompt sooner and draft the rest of
the reply) and its matched control (a decoy request of the same template, one per pair
and condition, never sent in a probed namespace, followed by its own reply of as many
tokens, fetched beforehand in a throwaway namespace and no further: what a control
decodes was never answered to anyone, so a store shared by mistake drafts it nothing).
Each probe is measured by its stream: time to the first token, time per token after
it, and tokens per chunk. Where /metrics answers the prober's key, the server's
counters around each probe are kept too (prefix-cache hit tokens, drafted and accepted
tokens): for the record, never scored. Each feature's AUC says how well it tells a
true probe from a control (0.5: not at all; reported as max(AUC, 1 - AUC), the better
of the two directions an attacker could pick).

What makes the control see a leak where there is one:
- a secret per pair, sent right before it: the victim's entry is the prefix cache's
  most recently used however many probes and decoys came before (the LRU order is
  global; a pair then stores at most four prompts before its last probe, and the
  default 64 MiB keeps about eight of these by our estimate of the default model's
  keys, values and taps per token: each probe's prefix-hit counter says whether it
  held), and the true probes are as varied as
  the controls (with one secret for all, every true probe decoded the same text, and
  how well the drafter guessed that one text told it from the controls across
  namespaces, AUC 0.68 on tokens per chunk, with no store involved);
- a pair's four probes (two conditions, two kinds) go in a random order and cut their
  replies at the same fraction, so drift in the machine's speed and in the engine's
  adaptive state (governors, calibration, step-time table) falls on every kind and
  condition alike: the control is measured on the same server states as the attack;
- the prompts are in the chat format, where the default model answers in varied
  prose; from bare text it soon repeats itself, and prompt lookup in the request's
  own tokens then predicts what the history would (the history is asked only where
  the request's own tokens have no 3-token match), hiding the history's leak;
- each probe decodes `probe_tokens` (32) tokens, all inside the victim's reply
  (`reply_tokens` 96, cut at a third to a half of its words), so that the history's
  drafts show in the time per token and the chunk sizes.

Pass: AUC <= 0.6 on every feature across namespaces, and inside the victim's
namespace both stores' leaks seen: time to first token (the prefix cache) and time per
token or tokens per chunk (the reply history) each at 0.9 or more; else the run is
inconclusive: a harness that cannot see a leak where it exists proves nothing where it
finds none.

HTTP only (no torch): it runs against any server that knows the two keys.
"""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

FEATURES = ("ttft_s", "per_token_s", "tokens_per_chunk")

#: which store's leak each feature shows: a prefix-cache hit starts a prompt sooner; a
#: reply history's drafts make a reply decode in fewer, larger steps
STORES = {"prefix cache": ("ttft_s",), "reply history": ("per_token_s", "tokens_per_chunk")}

#: the server's counters kept around each probe where /metrics answers (not scored)
COUNTERS = {"prefix_hit_tokens": "prefix_cache_hits_total",
            "draft_tokens": "spec_decode_num_draft_tokens_total",
            "accepted_tokens": "spec_decode_num_accepted_tokens_total"}

#: what the secret and decoy requests are drawn from: ordinary English, so that the
#: model's replies are ordinary, varied text
WORDS = ("river mountain garden letter window morning silver orange quiet forest harbor teacher market "
         "winter lantern village candle bridge summer meadow pocket thunder basket castle mirror planet "
         "ticket doctor engine island jacket kitchen ladder needle pillow rabbit saddle tunnel violin "
         "wagon yellow anchor blanket copper desert feather glacier hammer ivory jungle kettle").split()
NAMES = ("Tom Anna Maria Peter Lucy Omar Elena Jack Sofia Ivan Clara Hugo Nina Felix Rosa Leo Mira Paul "
         "Ada Tariq Greta Milo Iris Sam").split()
TRADES = ("baker carpenter fisherman weaver potter tailor farmer painter sailor miller shepherd "
          "clockmaker blacksmith gardener").split()


@dataclass
class Probe:
    kind: str  # "true" or "control"
    ttft_s: float
    per_token_s: float
    tokens_per_chunk: float
    #: the server's counters over this probe (COUNTERS), {} where /metrics did not answer
    counters: dict = field(default_factory=dict)


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

    def store_auc(self, store: str) -> float:
        """The best AUC among the features that show `store`'s leak (STORES)."""
        return max(self.auc(f) for f in STORES[store])

    def summary(self) -> dict:
        kinds = ("true", "control")
        out = {"condition": self.condition, "probes": len(self.probes),
               "auc": {f: round(self.auc(f), 3) for f in FEATURES},
               "medians": {kind: {f: _median([getattr(p, f) for p in self.probes if p.kind == kind])
                                  for f in FEATURES} for kind in kinds}}
        counted = [p for p in self.probes if p.counters]
        if counted:
            # per kind: each counter's total, and how many probes reused a kept prefix at all
            out["counters"] = {kind: {**{c: sum(p.counters.get(c, 0) for p in counted if p.kind == kind)
                                         for c in COUNTERS},
                                      "probes_with_prefix_hit": sum(p.counters.get("prefix_hit_tokens", 0) > 0
                                                                    for p in counted if p.kind == kind)}
                               for kind in kinds}
        return out


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


#: the default model's chat format with its default system prompt (SmolLM2's ChatML), as
#: its chat endpoint renders a one-message conversation: in it the model answers in
#: varied prose, where from bare text it soon repeats itself (and then prompt lookup in
#: the request's own tokens predicts what the history would, hiding the history's leak)
CHATML = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
          "<|im_start|>user\n{request}<|im_end|>\n<|im_start|>assistant\n")
#: a prompt as it is: for a model without that format (--template '{request}')
PLAIN = "{request}"


def secret_text(rng: random.Random, template: str = CHATML) -> str:
    """A request for a story with random names, trades and things, in `template` (about
    85 tokens with the default model's chat format, 55 of them the request's own): the
    secret and the decoys alike, so that they are matched."""
    w = lambda: rng.choice(WORDS)  # noqa: E731
    name, friend = rng.sample(NAMES, 2)
    request = (f"Write a short story about {name}, a {rng.choice(TRADES)} who lives near the {w()} {w()}. "
               f"{name} keeps a {w()}, a {w()} and a {w()} at home, and one morning finds a {w()} under the "
               f"{w()}. Include {name}'s friend {friend}, a {rng.choice(TRADES)}, and an old {w()}.")
    return template.format(request=request)


def cut(reply: str, fraction: float) -> str:
    """The reply's first `fraction` of its words (at least one): a probe's prompt ends
    inside the reply, so that what the probe decodes is the reply's continuation."""
    words = reply.split(" ")
    return " ".join(words[: max(1, round(len(words) * fraction))])


#: the two conditions: the attacker's own key (a fresh salt per probe), and the victim's
#: key and salt (the control)
CONDITIONS = ("across namespaces", "same namespace")


def pair_schedule(pairs: int, rng: random.Random) -> list[tuple[int, list[tuple[str, str]], float]]:
    """Per pair, in a random order of pairs: its index, its four probes (condition, kind)
    in a random order, and the fraction of the replies they all carry (a third to a half)."""
    order = list(range(pairs))
    rng.shuffle(order)
    out = []
    for i in order:
        probes = [(condition, kind) for condition in CONDITIONS for kind in ("true", "control")]
        rng.shuffle(probes)
        out.append((i, probes, rng.uniform(1 / 3, 1 / 2)))
    return out


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

    def counters(self, key: str) -> dict[str, float]:
        """COUNTERS' values now (summed over labels); {} where /metrics does not answer."""
        try:
            r = self.http.get(self.url + "/metrics", headers={"Authorization": f"Bearer {key}"})
        except httpx.HTTPError:
            return {}
        if r.status_code != 200:
            return {}
        return parse_counters(r.text)

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


def parse_counters(text: str) -> dict[str, float]:
    """COUNTERS' values from Prometheus text (any name prefix, summed over labels)."""
    totals = {mine: 0.0 for mine in COUNTERS}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for mine, theirs in COUNTERS.items():
            if name == theirs or name.endswith(":" + theirs):
                totals[mine] += float(line.rsplit(" ", 1)[1])
    return totals


@dataclass
class LeakConfig:
    victim_key: str
    attacker_key: str
    victim_salt: str | None = None
    probes: int = 50  # per kind and condition
    probe_tokens: int = 32
    reply_tokens: int = 96
    seed: int = 0
    template: str = CHATML  # the prompts' frame, with {request}
    fetch_concurrency: int = 1  # decoy replies fetched at once (untimed)


def run_leak(client: Client, cfg: LeakConfig, log=print) -> list[LeakResult]:
    """The decoys' replies, then per pair the victim's request and the pair's four
    probes (see the module docstring)."""
    rng = random.Random(cfg.seed)
    schedule = pair_schedule(cfg.probes, rng)
    secrets = {i: secret_text(rng, cfg.template) for i, _, _ in schedule}
    jobs = []
    for i, _, fraction in schedule:
        for condition in CONDITIONS:  # one each: a store shared by mistake must not serve one from the other
            # its reply as far as its probe's prompt carries it (no further: a store shared
            # by mistake would then draft nothing of what the control decodes), in a
            # namespace nobody probes, in the pairs' order (the first probed, the longest ago)
            jobs.append(((i, condition), secret_text(rng, cfg.template), f"decoy-{cfg.seed}-{i}-{condition[0]}",
                         max(1, round(cfg.reply_tokens * fraction))))

    def fetch(job):
        _, prompt, salt, tokens = job
        return prompt + client.reply(prompt, cfg.attacker_key, salt, tokens)

    # untimed, so several at once where asked (the engine batches them)
    with ThreadPoolExecutor(max(1, cfg.fetch_concurrency)) as pool:
        decoys = dict(zip((job[0] for job in jobs), pool.map(fetch, jobs)))
    log(f"{len(decoys)} decoys and their replies fetched")
    results = {condition: LeakResult(condition) for condition in CONDITIONS}
    for n, (i, probes, fraction) in enumerate(schedule):
        # the victim's request, right before the pair: its prompt is the prefix cache's
        # most recently used entry, its reply the history's newest
        reply = client.reply(secrets[i], cfg.victim_key, cfg.victim_salt, cfg.reply_tokens)
        if len(reply.split()) < 8:
            raise RuntimeError(f"a victim's reply of {cfg.reply_tokens} tokens has {len(reply.split())} "
                               f"words ({reply[:80]!r}): no continuation to probe")
        for condition, kind in probes:
            prompt = secrets[i] + cut(reply, fraction) if kind == "true" else decoys[i, condition]
            if condition == "same namespace":
                key, salt = cfg.victim_key, cfg.victim_salt
            else:
                key, salt = cfg.attacker_key, f"probe-{cfg.seed}-{n}-{kind}"
            before = client.counters(key)
            probe = client.timed(prompt, key, salt, cfg.probe_tokens, kind)
            after = client.counters(key) if before else {}
            probe.counters = {c: after[c] - before[c] for c in before if c in after}
            results[condition].probes.append(probe)
        if (n + 1) % 10 == 0:
            log(f"{n + 1} of {cfg.probes} pairs probed")
    for result in results.values():
        log(json.dumps(result.summary()))
    return list(results.values())


def verdict(results: list[LeakResult], cross_max: float = 0.6, control_min: float = 0.9) -> str:
    """'pass', 'fail' (a feature leaks across namespaces) or 'inconclusive' (inside the
    victim's namespace the control did not see both stores' leaks: STORES)."""
    by = {r.condition: r for r in results}
    if any(by["same namespace"].store_auc(store) < control_min for store in STORES):
        return "inconclusive"
    return "pass" if all(by["across namespaces"].auc(f) <= cross_max for f in FEATURES) else "fail"
