"""The measured cost of one decode step: target time by token count, drafter time by
request count.

`dspark profile` measures a table once per (model, dtype, device, machine) and saves it
as JSON; the prefix scheduler reads it every step. The file looks like

    {"model": "...", "dtype": "bfloat16", "device": "cuda:0", "machine": "...",
     "context_len": 1024,
     "token_counts": [1, 2, 4, ...],        # ascending
     "raw_ms": [...],                       # medians as measured
     "step_ms": [...],                      # raw_ms made non-decreasing
     "drafter": null | {"method": "dspark", "request_counts": [1, 2, ...],
                        "raw_ms": [...], "step_ms": [...]}}

Times are stored in milliseconds (what a person reads) and returned in seconds (what
the objective divides by). Between measured counts the time is interpolated linearly.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dspark.errors import UserError

from .curves import _interp_ms, _memo_interp, isotonic, make_monotone, spikes  # noqa: F401 (isotonic, spikes: re-exported)


class ScheduleError(UserError, ValueError):
    """A bad step-time table or scheduler setting supplied by the user."""


def load_level(n_requests: int) -> int:
    """The load level of a step of `n_requests` decodes: 1, 2-3, 4-7, 8-15, ... requests
    are levels 1, 2, 3, 4, ... (what the step costs, and whether speculation pays,
    changes with the order of magnitude of the batch)."""
    return max(1, n_requests).bit_length()


def _check_curve(where: str, counts: list[int], raw_ms: list[float], step_ms: list[float]) -> None:
    if not counts:
        raise ScheduleError(f"{where}: no measurements; profile at least one count")
    if not len(counts) == len(raw_ms) == len(step_ms):
        raise ScheduleError(
            f"{where}: {len(counts)} counts but {len(raw_ms)} raw_ms and {len(step_ms)} step_ms; "
            "each count needs one time in each list"
        )
    if counts[0] < 1 or any(b <= a for a, b in zip(counts, counts[1:])):
        raise ScheduleError(f"{where}: counts must be positive and strictly ascending, got {counts}")
    for name, times in (("raw_ms", raw_ms), ("step_ms", step_ms)):
        if not all(math.isfinite(t) and t > 0 for t in times):
            raise ScheduleError(f"{where}: {name} must be finite and positive, got {times}")
    if any(b < a for a, b in zip(step_ms, step_ms[1:])):
        raise ScheduleError(
            f"{where}: step_ms must be non-decreasing, got {step_ms}; "
            "rebuild it from raw_ms with make_monotone or re-run `dspark profile`"
        )


@dataclass
class DrafterTimeTable:
    """Drafter time per step by the number of requests drafted (the drafter drafts
    its whole block for every request whatever the scheduler verifies, so its cost
    depends on the request count only)."""

    method: str
    request_counts: list[int]
    raw_ms: list[float]
    step_ms: list[float] | None = None  # None: make_monotone(raw_ms)

    def __post_init__(self) -> None:
        self.request_counts = [int(c) for c in self.request_counts]
        self.raw_ms = [float(t) for t in self.raw_ms]
        self.step_ms = make_monotone(self.raw_ms) if self.step_ms is None else [float(t) for t in self.step_ms]
        _check_curve("drafter step-time table", self.request_counts, self.raw_ms, self.step_ms)
        self._counts = np.asarray(self.request_counts, dtype=np.float64)
        self._ms = np.asarray(self.step_ms, dtype=np.float64)

    def time(self, n_requests: int) -> float:
        """Seconds to draft for `n_requests` requests (0 for none)."""
        if n_requests <= 0:
            return 0.0
        return _memo_interp(self, n_requests)

    def scale(self, factor: float) -> None:
        """Multiply every time by `factor` (in place)."""
        self.raw_ms = [t * factor for t in self.raw_ms]
        self.step_ms = [t * factor for t in self.step_ms]
        self._ms = self._ms * factor

    def set_live_ms(self, ms) -> None:
        """Replace the times read (at the same counts) with a live estimate."""
        ms = np.asarray(ms, dtype=np.float64)
        if ms.shape != self._counts.shape:
            raise ScheduleError("live drafter times need one value per profiled request count")
        self._ms = ms

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "request_counts": self.request_counts,
            "raw_ms": self.raw_ms,
            "step_ms": self.step_ms,
        }


@dataclass
class StepTimeTable:
    """Target forward time by the number of tokens in the flattened batch, plus the
    drafter's time by the number of requests."""

    token_counts: list[int]
    raw_ms: list[float]
    step_ms: list[float] | None = None  # None: make_monotone(raw_ms)
    drafter: DrafterTimeTable | None = None
    model: str = ""
    dtype: str = ""
    device: str = ""
    machine: str = ""
    context_len: int = 0  # context length per request the profile ran at
    #: how it was measured: threads, cores busy with other work, repeatability (None: unknown)
    conditions: dict | None = None

    def __post_init__(self) -> None:
        self.token_counts = [int(c) for c in self.token_counts]
        self.raw_ms = [float(t) for t in self.raw_ms]
        self.step_ms = make_monotone(self.raw_ms) if self.step_ms is None else [float(t) for t in self.step_ms]
        _check_curve("target step-time table", self.token_counts, self.raw_ms, self.step_ms)
        self._counts = np.asarray(self.token_counts, dtype=np.float64)
        self._ms = np.asarray(self.step_ms, dtype=np.float64)
        #: bumped whenever the times the scheduler reads change (scale, live updates)
        self.version = 0
        #: per load level (requests' bit length): seconds a speculative step spends
        #: outside the target's forward and the drafter beyond what a plain step spends
        #: there (lookup, verification, bookkeeping), as measured while serving
        self._spec_overhead: dict[int, float] = {}
        #: per load level: seconds a drafting step spends outside the target's forward and
        #: the drafter's call beyond what a speculative step without drafting spends there
        #: (checking and merging drafts, pricing them, verifying their distributions)
        self._draft_overhead: dict[int, float] = {}

    @property
    def max_token_count(self) -> int:
        """The largest token count measured; beyond it times are extrapolated."""
        return self.token_counts[-1]

    def target_time(self, n_tokens: int) -> float:
        """Seconds for one target forward over `n_tokens` tokens (0 for none)."""
        if n_tokens <= 0:
            return 0.0
        return _memo_interp(self, n_tokens)

    def drafter_time(self, n_requests: int) -> float:
        """Seconds for the drafter to draft for `n_requests` requests; 0 without a
        drafter table."""
        return 0.0 if self.drafter is None else self.drafter.time(n_requests)

    def step_time(self, n_tokens: int, n_requests: int) -> float:
        """Seconds for a whole decode step: draft for `n_requests`, verify `n_tokens`."""
        return self.target_time(n_tokens) + self.drafter_time(n_requests)

    def spec_overhead(self, n_requests: int) -> float:
        """Seconds a step of `n_requests` pays for speculating at all, beyond the
        target's forward and the drafter (0 until measured; `dspark.schedule.live`)."""
        return self._spec_overhead.get(load_level(n_requests), 0.0)

    def set_spec_overhead(self, n_requests: int, seconds: float) -> None:
        self._spec_overhead[load_level(n_requests)] = max(0.0, float(seconds))
        self.version += 1

    def draft_overhead(self, n_requests: int) -> float:
        """Seconds a drafting step of `n_requests` decodes pays outside the target's
        forward and the drafter's call beyond a speculative step that only looked up (0
        until measured; `dspark.schedule.live`). Charged with the drafter's time."""
        return self._draft_overhead.get(load_level(n_requests), 0.0)

    def set_draft_overhead(self, n_requests: int, seconds: float) -> None:
        self._draft_overhead[load_level(n_requests)] = max(0.0, float(seconds))
        self.version += 1

    def admission_times(self, n_tokens: np.ndarray, n_requests: int, drafted: bool = True, others: int = 0,
                        other_tokens: int = 0) -> np.ndarray:
        """What the scheduler divides expected tokens by: for steps whose forward holds
        `n_tokens` in all (`n_requests` speculating requests with their drafts, `others`
        requests verifying nothing, `other_tokens` prompt tokens), the target's time,
        the drafter's for `n_requests` and `draft_overhead` when it `drafted`, and
        `spec_overhead` (at the step's whole load) wherever any drafted token is verified.

        Prompt tokens place the drafts where they land on the curve, but are not
        charged to them: the time is the decodes' plain step, T(R + others), plus what
        the drafts add to the whole forward, T(n) - T(R + others + other_tokens). (A
        prompt chunk's fixed cost in the denominator would make drafts look cheap next
        to it; without the chunk, drafts that fall past a knee it causes look free.)"""
        n_tokens = np.asarray(n_tokens, dtype=np.float64)
        times = self.step_times(n_tokens, n_requests) if drafted else self.target_times(n_tokens)
        if drafted:
            times = times + self.draft_overhead(n_requests + others)
        plain, chunk, overhead = self._admission_terms(n_requests, others, other_tokens)
        if other_tokens:
            times = times - chunk
        return times + np.where(n_tokens > plain, overhead, 0.0)

    def admission_time(self, n_tokens: int, n_requests: int, drafted: bool = True, others: int = 0,
                       other_tokens: int = 0) -> float:
        """`admission_times` at one (integer) token count, from the remembered per-count
        times: the same numbers, without numpy's per-call cost."""
        t = self.target_time(n_tokens) + (self.drafter_time(n_requests) + self.draft_overhead(n_requests + others)
                                          if drafted else 0.0)
        plain, chunk, overhead = self._admission_terms(n_requests, others, other_tokens)
        if other_tokens:
            t = t - chunk
        return t + (overhead if n_tokens > plain else 0.0)

    def _admission_terms(self, n_requests: int, others: int, other_tokens: int) -> tuple[int, float, float]:
        """The step's plain token count (decodes and prompt tokens), the prompt chunk's
        share of the forward (not charged to the drafts), and the speculation overhead
        at the decodes' load: what `admission_times` and `admission_time` both apply."""
        decodes = n_requests + others
        plain = decodes + other_tokens
        chunk = self.target_time(plain) - self.target_time(decodes) if other_tokens else 0.0
        return plain, chunk, self.spec_overhead(decodes)

    def scale(self, factor: float) -> None:
        """Multiply every time, the drafter's too, by `factor` (in place: a scheduler
        holding this table sees the new times from its next step)."""
        if not factor > 0:
            raise ScheduleError(f"a step-time table can only be scaled by a positive factor, got {factor}")
        self.raw_ms = [t * factor for t in self.raw_ms]
        self.step_ms = [t * factor for t in self.step_ms]
        self._ms = self._ms * factor
        if self.drafter is not None:
            self.drafter.scale(factor)
        self.version += 1

    def set_live_ms(self, target_ms, drafter_ms=None) -> None:
        """Replace the times the scheduler reads (at the same counts) with a live
        estimate (`dspark.schedule.live`); `raw_ms` and `step_ms` keep the profile."""
        target_ms = np.asarray(target_ms, dtype=np.float64)
        if target_ms.shape != self._counts.shape:
            raise ScheduleError("live step times need one value per profiled token count")
        self._ms = target_ms
        if drafter_ms is not None and self.drafter is not None:
            self.drafter.set_live_ms(drafter_ms)
        self.version += 1

    def target_times(self, n_tokens: np.ndarray) -> np.ndarray:
        """`target_time` for many (positive) token counts at once."""
        return _interp_ms(np.asarray(n_tokens, dtype=np.float64), self._counts, self._ms) / 1000.0

    def step_times(self, n_tokens: np.ndarray, n_requests: int) -> np.ndarray:
        """`step_time` for many token counts at once (the scheduler's inner loop).
        `n_tokens` must be positive."""
        return self.target_times(n_tokens) + self.drafter_time(n_requests)

    @classmethod
    def synthetic(
        cls,
        base_ms: float = 10.0,
        knee: int = 16,
        per_token_ms: float = 0.5,
        max_tokens: int = 1024,
        drafter_ms: float = 0.0,
    ) -> "StepTimeTable":
        """A memory-bound-then-compute-bound curve for tests: `base_ms` up to `knee`
        tokens, then `per_token_ms` more per token; a constant `drafter_ms` when > 0."""
        if not 1 <= knee <= max_tokens:
            raise ScheduleError(f"need 1 <= knee <= max_tokens, got knee={knee}, max_tokens={max_tokens}")
        counts = sorted({1, knee, max_tokens} | {2**i for i in range(max_tokens.bit_length()) if 2**i <= max_tokens})
        ms = [base_ms + per_token_ms * max(0, n - knee) for n in counts]
        drafter = None
        if drafter_ms > 0:
            drafter = DrafterTimeTable(method="synthetic", request_counts=[1], raw_ms=[drafter_ms])
        return cls(token_counts=counts, raw_ms=ms, drafter=drafter, model="synthetic", device="none")

    # -- JSON ---------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "dtype": self.dtype,
            "device": self.device,
            "machine": self.machine,
            "context_len": self.context_len,
            "token_counts": self.token_counts,
            "raw_ms": self.raw_ms,
            "step_ms": self.step_ms,
            "drafter": None if self.drafter is None else self.drafter.to_dict(),
            "conditions": self.conditions,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, d: dict) -> "StepTimeTable":
        try:
            drafter = d.get("drafter")
            return cls(
                token_counts=d["token_counts"],
                raw_ms=d["raw_ms"],
                step_ms=d.get("step_ms"),
                drafter=None if drafter is None else DrafterTimeTable(
                    method=drafter.get("method", ""),
                    request_counts=drafter["request_counts"],
                    raw_ms=drafter["raw_ms"],
                    step_ms=drafter.get("step_ms"),
                ),
                model=d.get("model", ""),
                dtype=d.get("dtype", ""),
                device=d.get("device", ""),
                machine=d.get("machine", ""),
                context_len=int(d.get("context_len", 0)),
                conditions=d.get("conditions") if isinstance(d.get("conditions"), dict) else None,
            )
        except ScheduleError:
            raise
        except KeyError as e:
            raise ScheduleError(f"step-time table lacks the field {e.args[0]!r}") from None
        except (TypeError, AttributeError, ValueError) as e:
            raise ScheduleError(f"step-time table is malformed: {e}") from None

    @classmethod
    def from_json(cls, text: str) -> "StepTimeTable":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ScheduleError(f"step-time table is not valid JSON: {e}") from None
        if not isinstance(d, dict):
            raise ScheduleError("step-time table must be a JSON object")
        return cls.from_dict(d)

    def save(self, path: str | Path) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "StepTimeTable":
        p = Path(path)
        try:
            text = p.read_text()
        except FileNotFoundError:
            raise ScheduleError(f"{p} not found: measure a step-time table with `dspark profile`") from None
        try:
            return cls.from_json(text)
        except ScheduleError as e:
            raise ScheduleError(f"{p}: {e}") from None
