"""Request state inside the engine."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

import torch

from dspark.sampling import SamplingParams, StopRule

_ids = itertools.count()


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class SpecStats:
    """Speculation counters of one request (or, summed, of an engine)."""

    rounds: int = 0  # verification rounds that drafted at least one token
    draft_tokens: int = 0
    accepted_tokens: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)

    def record(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted == 0:
            return
        self.rounds += 1
        self.draft_tokens += num_drafted
        self.accepted_tokens += num_accepted
        need = num_drafted - len(self.drafted_per_position)
        if need > 0:
            self.drafted_per_position += [0] * need
            self.accepted_per_position += [0] * need
        for k in range(num_drafted):
            self.drafted_per_position[k] += 1
            if k < num_accepted:
                self.accepted_per_position[k] += 1

    def merge(self, other: "SpecStats") -> None:
        self.rounds += other.rounds
        self.draft_tokens += other.draft_tokens
        self.accepted_tokens += other.accepted_tokens
        for k in range(len(other.drafted_per_position)):
            if k >= len(self.drafted_per_position):
                self.drafted_per_position.append(0)
                self.accepted_per_position.append(0)
            self.drafted_per_position[k] += other.drafted_per_position[k]
            self.accepted_per_position[k] += other.accepted_per_position[k]

    @property
    def acceptance_length(self) -> float:
        """Mean tokens emitted per verification round: accepted drafts + 1."""
        return (self.accepted_tokens + self.rounds) / self.rounds if self.rounds else 1.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """P(draft k accepted | k was verified), k = 1..max."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    def as_dict(self) -> dict:
        return {
            "acceptance_length": round(self.acceptance_length, 4),
            "per_position_acceptance": [round(x, 4) for x in self.per_position_acceptance],
            "num_rounds": self.rounds,
            "num_draft_tokens": self.draft_tokens,
            "num_accepted_tokens": self.accepted_tokens,
        }


@dataclass
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    request_id: object = field(default_factory=lambda: next(_ids))
    status: Status = Status.WAITING
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_token_id: int | None = None  # the token that ended it (not in output_ids), if a token did
    stop_rule: StopRule | None = None  # the engine's, made on first use
    error: str | None = None
    slot: int = -1
    #: the last emitted token; not yet in the target KV cache (it is the next anchor)
    anchor: int = -1
    generator: torch.Generator | None = None
    stats: SpecStats = field(default_factory=SpecStats)
    #: position of the anchor == tokens in the target KV cache
    num_cached: int = 0
    #: prompt tokens already in the KV cache (a long prompt is prefilled in chunks)
    num_prefilled: int = 0
    #: the drafter taps of a prompt prefix reused from the prefix cache, until the
    #: prompt's prefill completes
    reused_taps: object = None
    #: False: never drafted for (plain decoding inside a speculative engine, e.g. the
    #: race of plain against speculative decoding)
    speculate: bool = True
    #: steps that emitted tokens to this request (its prefill's last chunk included)
    num_steps: int = 0
    #: the namespace of the state shared across requests it may read and add to (the
    #: prefix cache, the reply history): the serving layer's hash of a tenant and its
    #: cache salt; None, the shared one
    namespace: str | None = None
    #: who may watch it in the live view (the serving layer's tenant; None: anyone)
    owner: str | None = None

    @property
    def prefilled(self) -> bool:
        return self.num_prefilled == len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED
