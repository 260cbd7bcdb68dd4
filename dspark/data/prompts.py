"""Prompt sets with fixed train / held-out splits and domain labels.

Splits (fixed by index or by source, so they never change between runs):

| source    | domain             | train                    | held-out                   |
|-----------|--------------------|--------------------------|----------------------------|
| gsm8k     | math               | questions 0..999         | questions 1000..1318 (319) |
| champ     | math               | all 270 (if installed)   | -                          |
| sharegpt  | code / chat        | all usable first turns   | -                          |
| humaneval | code               | -                        | all 164                    |
| mtbench   | chat               | -                        | all 80 (first turn)        |

Training prompts are deduplicated (whitespace- and case-insensitive text, first
occurrence kept, sources in the order gsm8k, champ, sharegpt) and decontaminated: a
training prompt is dropped when its text equals a held-out prompt or turn, or shares a
run of `NGRAM` consecutive words with one. So no evaluation prompt is ever trained on.

ShareGPT first turns are split into code and chat by `looks_like_code`: a code fence,
a line that reads like source code, or the name of a language, tool or programming
word. Everything else is chat. The heuristic errs towards code on mixed prompts.

A `Prompt`'s `messages` hold the first user turn in OpenAI chat format; MT-Bench's
second question is in `follow_ups`, for callers that run the second turn after the
first reply.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from functools import lru_cache

from .sources import PACKAGES, READERS, DataError, RawPrompt, is_available

DOMAINS = ("math", "code", "chat")
SPLITS = ("train", "heldout")
GSM8K_TRAIN_SIZE = 1000  # questions 0..999 train; the last 319 are held out
NGRAM = 13  # words in a shared run that marks a training prompt as contaminated

# source -> (split, domain); domain None = decided per prompt
SOURCE_SPLITS: dict[str, tuple[str, str | None]] = {
    "champ": ("train", "math"),
    "sharegpt": ("train", None),
    "humaneval": ("heldout", "code"),
    "mtbench": ("heldout", "chat"),
}


@dataclass(frozen=True)
class Prompt:
    id: str  # "<source>/<key>", unique across all sets
    domain: str  # math | code | chat
    source: str
    messages: list[dict]  # OpenAI chat format: [{"role": "user", "content": ...}]
    follow_ups: tuple[str, ...] = ()  # later user turns (MT-Bench)
    meta: dict = field(default_factory=dict)  # per-source extras (answer, category, task_id)

    def to_json(self) -> dict:
        out = {"id": self.id, "domain": self.domain, "source": self.source, "messages": self.messages}
        if self.follow_ups:
            out["follow_ups"] = list(self.follow_ups)
        if self.meta:
            out["meta"] = self.meta
        return out


def load_prompts(split: str = "train", domain: str | None = None) -> list[Prompt]:
    """Prompts of one split, optionally of one domain, in a fixed order.

    Raises `MissingDataPackage` (naming the pip command) when a required set is not
    installed; the optional CHAMP set is left out when absent."""
    if split not in SPLITS:
        raise DataError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if domain is not None and domain not in DOMAINS:
        raise DataError(f"domain must be one of {', '.join(DOMAINS)}, got {domain!r}")
    return [
        Prompt(f"{source}/{raw.key}", dom, source, [{"role": "user", "content": raw.text}],
               raw.follow_ups, dict(raw.meta))
        for source, dom, raw in (_train_rows() if split == "train" else _heldout_rows())
        if domain is None or dom == domain
    ]


def missing_optional_sources() -> list[str]:
    """Optional sets that are not installed, with the command that adds each."""
    return [f"{name} ({pkg.pip})" for name, pkg in PACKAGES.items() if pkg.optional and not is_available(name)]


_CODE_SYNTAX = re.compile(
    r"```|^\s*(?:def |class \w+\s*[:(]|import \w|from [\w.]+ import |#include|public |private |function |"
    r"const |let |var |select\b[^\n]* from\b|create table |<\?php|<div|<html)|\(\)\s*[;{]|=>|\w\([^()\n]*\)\s*\{",
    re.IGNORECASE | re.MULTILINE,
)
# Lower-cased words (split on anything but letters, digits and `+#.`) that mark code.
_CODE_WORDS = frozenset(
    "python javascript typescript java c++ c# golang rust sql html css react reactjs node.js nodejs bash "
    "php kotlin swift regex django flask pandas numpy dockerfile docker kubernetes powershell matlab vba "
    "code coding script program programming function algorithm debug compile compiler api sdk github "
    "gitlab git json yaml database dll linux".split()
)
_WORD = re.compile(r"[a-z][a-z0-9+#.]*")


def looks_like_code(text: str) -> bool:
    """The documented code/chat split of ShareGPT prompts (see the module docstring)."""
    if _CODE_SYNTAX.search(text):
        return True
    return not _CODE_WORDS.isdisjoint(w.rstrip(".") for w in _WORD.findall(text.lower()))


def normalize(text: str) -> str:
    return " ".join(text.lower().split())


def stable_rank(prompt_id: str) -> str:
    """A fixed pseudo-random order key, independent of load order and of any seed."""
    return hashlib.sha256(prompt_id.encode()).hexdigest()


Row = tuple[str, str, RawPrompt]  # (source, domain, raw prompt)


@lru_cache(maxsize=1)
def _heldout_rows() -> list[Row]:
    gsm8k = list(READERS["gsm8k"]())
    rows: list[Row] = [("gsm8k", "math", raw) for raw in gsm8k[GSM8K_TRAIN_SIZE:]]
    for source in ("humaneval", "mtbench"):
        rows.extend((source, SOURCE_SPLITS[source][1], raw) for raw in READERS[source]())
    return rows


@lru_cache(maxsize=1)
def _train_rows() -> list[Row]:
    """Training rows: deduplicated and decontaminated against the held-out rows."""
    candidates: list[Row] = [("gsm8k", "math", raw) for raw in list(READERS["gsm8k"]())[:GSM8K_TRAIN_SIZE]]
    for source in ("champ", "sharegpt"):  # dedup keeps the first: gsm8k, then champ, then sharegpt
        if PACKAGES[source].optional and not is_available(source):
            continue
        fixed = SOURCE_SPLITS[source][1]
        for raw in READERS[source]():
            candidates.append((source, fixed or ("code" if looks_like_code(raw.text) else "chat"), raw))

    contaminated = _Contamination([t for _, _, raw in _heldout_rows() for t in (raw.text, *raw.follow_ups)])
    seen_text: set[str] = set()
    seen_id: set[str] = set()
    train: list[Row] = []
    for source, dom, raw in candidates:
        norm = normalize(raw.text)
        if norm in seen_text or contaminated(norm):
            continue
        seen_text.add(norm)
        key, n = raw.key, 1
        while f"{source}/{key}" in seen_id:  # ShareGPT repeats a few ids with other text
            n += 1
            key = f"{raw.key}#{n}"
        seen_id.add(f"{source}/{key}")
        if key != raw.key:
            raw = RawPrompt(key, raw.text, raw.follow_ups, raw.meta)
        train.append((source, dom, raw))
    return train


class _Contamination:
    """True for a normalized text equal to an evaluation text or sharing `NGRAM`
    consecutive words with one."""

    _words = re.compile(r"\w+")

    def __init__(self, eval_texts: list[str]) -> None:
        self.exact = {normalize(t) for t in eval_texts}
        self.grams: set[tuple[str, ...]] = set()
        self.vocab: set[str] = set()
        for t in eval_texts:
            w = self._words.findall(t.lower())
            self.vocab.update(w)
            self.grams.update(tuple(w[i : i + NGRAM]) for i in range(len(w) - NGRAM + 1))

    def __call__(self, norm_text: str) -> bool:
        if norm_text in self.exact:
            return True
        # Only runs of words that all occur in the evaluation texts can match.
        w = self._words.findall(norm_text)
        run = 0
        for i, word in enumerate(w):
            run = run + 1 if word in self.vocab else 0
            if run >= NGRAM and tuple(w[i - NGRAM + 1 : i + 1]) in self.grams:
                return True
        return False


def parse_mix(text: str) -> dict[str, float]:
    """`math=0.4,code=0.3,chat=0.3` -> weights normalised to sum 1."""
    mix: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in DOMAINS:
            raise DataError(f"mix entry {part!r} is not DOMAIN=WEIGHT with DOMAIN one of {', '.join(DOMAINS)}")
        try:
            w = float(value)
        except ValueError:
            raise DataError(f"mix weight {value!r} for {name} is not a number") from None
        if not 0 <= w < float("inf"):
            raise DataError(f"mix weight for {name} must be a finite number >= 0, got {value}")
        mix[name] = mix.get(name, 0.0) + w
    total = sum(mix.values())
    if total <= 0:
        raise DataError(f"mix {text!r} gives no domain a positive weight")
    return {k: v / total for k, v in mix.items() if v > 0}


def select_prompts(prompts: list[Prompt], mix: dict[str, float], num: int | None = None) -> list[Prompt]:
    """Pick `num` prompts (all when None) across domains in proportion to `mix`.

    Within a domain prompts are taken in `stable_rank` order, so a larger `num`
    extends a smaller one. A domain with too few prompts gives its share to the others.
    The result interleaves domains so that every prefix follows the mix too."""
    pools = {d: sorted((p for p in prompts if p.domain == d), key=lambda p: stable_rank(p.id)) for d in mix}
    available = sum(len(v) for v in pools.values())
    want = available if num is None else min(num, available)
    counts = _apportion(want, mix, {d: len(v) for d, v in pools.items()})
    keyed = [
        ((i + 0.5) / counts[d], d, p)
        for d in sorted(pools)
        for i, p in enumerate(pools[d][: counts[d]])
    ]
    keyed.sort(key=lambda row: (row[0], row[1]))
    return [p for _, _, p in keyed]


def _apportion(total: int, weights: dict[str, float], caps: dict[str, int]) -> dict[str, int]:
    """Integer counts summing to `total` (at most the sum of caps), proportional to
    `weights`, each within its cap: domains whose share exceeds their cap are filled
    and the rest shared again; then largest remainder."""
    counts = {d: 0 for d in weights}
    active = {d for d in weights if caps[d] > 0}
    total = min(total, sum(caps[d] for d in active))
    while active:
        left = total - sum(counts.values())
        wsum = sum(weights[d] for d in active)
        full = {d for d in active if caps[d] <= left * weights[d] / wsum}
        if not full:
            break
        for d in full:
            counts[d] = caps[d]
        active -= full
    left = total - sum(counts.values())
    if active and left > 0:
        wsum = sum(weights[d] for d in active)
        shares = {d: left * weights[d] / wsum for d in active}
        for d in active:
            counts[d] = int(shares[d])
        rest = left - sum(counts[d] for d in active)
        for d in sorted(active, key=lambda d: (int(shares[d]) - shares[d], d))[:rest]:
            counts[d] += 1
    return counts
