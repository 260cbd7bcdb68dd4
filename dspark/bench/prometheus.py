"""Reading speculative-decoding counters from a server's Prometheus `/metrics`.

Both `dspark serve` and vLLM (v1) export the same four counters, under their own
prefix:

    <prefix>:spec_decode_num_drafts_total                 verification rounds with >= 1 draft token
    <prefix>:spec_decode_num_draft_tokens_total           draft tokens verified
    <prefix>:spec_decode_num_accepted_tokens_total        draft tokens accepted
    <prefix>:spec_decode_num_accepted_tokens_per_pos_total{position="k"}   accepted at 0-based position k

A benchmark reads them before and after its run; the difference gives

    acceptance length  = 1 + accepted / drafts   (accepted drafts plus the bonus token, per round)
    acceptance rate    = accepted / draft tokens
    per-position rate  = accepted at position k / drafts   (unconditional, vLLM's convention)

Series that differ only in other labels (vLLM's engine index, for instance) are
summed; when a `model_name` label is present and one of its values equals the
benchmarked model, only those series count.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

PREFIXES = ("dspark", "vllm")
DRAFTS = "spec_decode_num_drafts_total"
DRAFT_TOKENS = "spec_decode_num_draft_tokens_total"
ACCEPTED = "spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "spec_decode_num_accepted_tokens_per_pos_total"

_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def _float(text: str) -> float:
    low = text.lower()
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    return float(text)  # also "NaN"


def parse_prometheus(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition (format 0.0.4); comments,
    blank lines and lines that are not samples are skipped."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.fullmatch(line)
        if m is None:
            continue
        labels = {k: _unescape(v) for k, v in _LABEL.findall(m.group(2) or "")}
        try:
            samples.append(Sample(m.group(1), labels, _float(m.group(3))))
        except ValueError:
            continue
    return samples


@dataclass
class SpecDecodeCounters:
    """One reading of the speculative-decoding counters."""

    prefix: str
    num_drafts: float = 0.0
    num_draft_tokens: float = 0.0
    num_accepted_tokens: float = 0.0
    accepted_per_position: dict[int, float] = field(default_factory=dict)


def read_spec_counters(text: str, model: str | None = None) -> SpecDecodeCounters | None:
    """The counters in a `/metrics` text, or None when it has none under a known prefix."""
    samples = parse_prometheus(text)
    for prefix in PREFIXES:
        mine = [s for s in samples if s.name.startswith(prefix + ":spec_decode_")]
        if not any(s.name == f"{prefix}:{DRAFTS}" for s in mine):
            continue
        if model is not None and any(s.labels.get("model_name") == model for s in mine):
            mine = [s for s in mine if s.labels.get("model_name") == model]
        counters = SpecDecodeCounters(prefix)
        for s in mine:
            short = s.name[len(prefix) + 1:]
            if short == DRAFTS:
                counters.num_drafts += s.value
            elif short == DRAFT_TOKENS:
                counters.num_draft_tokens += s.value
            elif short == ACCEPTED:
                counters.num_accepted_tokens += s.value
            elif short == ACCEPTED_PER_POS and s.labels.get("position", "").isdigit():
                k = int(s.labels["position"])
                counters.accepted_per_position[k] = counters.accepted_per_position.get(k, 0.0) + s.value
        return counters
    return None


def acceptance_between(before: SpecDecodeCounters | None, after: SpecDecodeCounters | None) -> dict | None:
    """Acceptance figures for what happened between two readings; None when either
    reading is missing. A counter that went down (the server restarted) gives a
    dict with an `error` and no figures."""
    if before is None or after is None:
        return None
    drafts = after.num_drafts - before.num_drafts
    draft_tokens = after.num_draft_tokens - before.num_draft_tokens
    accepted = after.num_accepted_tokens - before.num_accepted_tokens
    positions = sorted(after.accepted_per_position)
    per_pos = [after.accepted_per_position[k] - before.accepted_per_position.get(k, 0.0) for k in positions]
    out = {"metrics_prefix": after.prefix, "num_drafts": drafts, "num_draft_tokens": draft_tokens,
           "num_accepted_tokens": accepted, "acceptance_length": None, "acceptance_rate": None,
           "mean_draft_length": None, "per_position_acceptance": []}
    if min([drafts, draft_tokens, accepted, *per_pos]) < 0:
        out["error"] = "a speculative-decoding counter went down during the run (did the server restart?)"
        return out
    if drafts > 0:
        out["acceptance_length"] = 1.0 + accepted / drafts
        out["mean_draft_length"] = draft_tokens / drafts
        out["per_position_acceptance"] = [n / drafts for n in _dense(positions, per_pos)]
    if draft_tokens > 0:
        out["acceptance_rate"] = accepted / draft_tokens
    return out


def _dense(positions: list[int], values: list[float]) -> list[float]:
    """Values at positions 0..max; positions a server did not report count 0."""
    if not positions:
        return []
    by_pos = dict(zip(positions, values))
    return [by_pos.get(k, 0.0) for k in range(max(positions) + 1)]
