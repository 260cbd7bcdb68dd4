"""Configurations compared step by step, without HTTP (`dspark bench engine`): one
engine per configuration, all in one process, stepped in turn (one step of each, then
again, in the reverse order every other round, so that no configuration always steps
right after another), so that the machine's drift falls on every configuration alike
within tens of milliseconds rather than within the minute a served point takes.

Each engine keeps `concurrency` requests in flight (a finished request is replaced by
the next prompt at once, as a client at that concurrency would), over the same
held-out prompts, greedy, `ignore_eos`. An engine's time is the sum of its own steps'
wall times; all do the same work, so plain decoding's time over a configuration's is
its speedup. With `repeats` R the whole run is repeated R times (fresh engines each
time, the order of the configurations rotated); the ratio is reported as the median
and range over repeats. Every step is split into the target's forward and the rest
(`target_seconds`), and each configuration's rounds are counted.

Every configuration is a `--speculative-config` (`ENGINE_CONFIGS`, built on
`dspark.presets`, or NAME=JSON) plus, at most, two real switches of the engine:
`NAME@PRECISION` loads the target in another precision, `NAME+uncached` turns the
prefix cache off (`EngineConfig.prefix_caching`). Variants that were made by patching
the engine's internals after construction are retired; their answers are in
docs/journal.md (scripts/bench_lockstep.py at 954c485 ran them).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dspark.engine.config import SpeculativeConfig
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.presets import DEFAULT, PRESETS
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams

#: the configurations `--configs` names (besides NAME=JSON ones)
ENGINE_CONFIGS: dict[str, dict | None] = {
    **PRESETS,
    # A/A controls: more plain engines; a second one's ratio to `plain` is the method's
    # own resolution in that run, several show the lanes' positions in the stepping order
    "plain-again": None,
    "plain-b": None,
    "plain-c": None,
    "default-plain-from4": {**DEFAULT, "plain_fallback": 4},  # levels of 4+ requests start plain
    "default-no-history": {**DEFAULT, "lookup_history": False},  # no lookup in earlier replies
    "default-profiled": {**DEFAULT, "live_step_time": False},  # the step-time table as profiled, never corrected
    "default-dq8": {**DEFAULT, "drafter_weights": "q8_0"},  # the drafter's linears as Q8_0 blocks (q8x kernel)
    "default-dq4": {**DEFAULT, "drafter_weights": "q4_0"},  # ... as Q4_0 blocks
    "hybrid-fallback": {**PRESETS["hybrid"], "plain_fallback": True},  # the plain-decoding fallback at every load
    "lookup3": {"method": "ngram", "num_speculative_tokens": 3},  # up to 3 lookup tokens, fixed
    "lookup-governed": {"method": "ngram", "plain_fallback": True},  # the plain-decoding fallback at every load
    "lookup-governed-from2": {"method": "ngram", "plain_fallback": 2},  # from 2 requests, starting plain
    "lookup3-governed-from2": {"method": "ngram", "num_speculative_tokens": 3, "plain_fallback": 2},
}


@dataclass(frozen=True)
class LaneSpec:
    """One configuration as `--configs` names it: NAME[+uncached][@PRECISION]."""

    label: str
    speculative: dict | None
    precision: str | None = None
    prefix_caching: bool = True

    @classmethod
    def parse(cls, label: str, configs: dict[str, dict | None]) -> LaneSpec:
        name, _, precision = label.partition("@")
        base, plus, switch = name.partition("+")
        if base not in configs or (plus and switch != "uncached"):
            raise ValueError(f"unknown configuration {label!r}: use NAME[+uncached][@PRECISION] with NAME one of "
                             f"{', '.join(configs)} or given by --config NAME=JSON")
        return cls(label, configs[base], precision or None, prefix_caching=not plus)


class Lane:
    """One configuration's engine, keeping `concurrency` requests in flight."""

    def __init__(self, name: str, engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams],
                 concurrency: int) -> None:
        self.name, self.engine, self.concurrency = name, engine, concurrency
        self.pending = list(zip(prompts, params))[::-1]
        self.seconds = 0.0
        self.target_seconds = 0.0  # in the target's forwards
        self.steps = 0
        self.tokens = 0
        self.speculated = 0  # steps that verified at least one drafted token

    def done(self) -> bool:
        return not self.pending and not self.engine.has_unfinished()

    def step(self) -> None:
        e = self.engine
        while self.pending and len(e.running) + len(e.waiting) < self.concurrency:
            e.add_request(*self.pending.pop())
        t = time.perf_counter()
        out = e.step()
        self.seconds += time.perf_counter() - t
        self.target_seconds += e.runner.last_target_seconds
        self.steps += 1
        self.tokens += sum(len(o.new_tokens) for o in out)
        self.speculated += bool(sum(e.runner.last_verify_lengths))

    def record(self) -> dict:
        return {"seconds": self.seconds, "target_seconds": self.target_seconds, "tok_s": self.tokens / self.seconds,
                "steps": self.steps, "speculated_steps": self.speculated,
                "drafting_priced_out": self.engine.runner.priced_out}


@dataclass
class LockstepRun:
    """The inputs of one comparison; `lanes` name configurations (plain among them)."""

    lanes: list[LaneSpec]
    prompts: list[list[int]]
    lengths: list[int]  # each prompt's output tokens
    concurrency: int
    repeats: int = 1
    warm_replies: list[list[int]] = field(default_factory=list)


def make_engine(target: Target, lane: LaneSpec, concurrency: int) -> LLMEngine:
    spec = SpeculativeConfig.from_dict(lane.speculative) if lane.speculative else None
    return LLMEngine(target, spec, EngineConfig(max_num_seqs=concurrency, max_model_len=2048,
                                                prefix_caching=lane.prefix_caching))


def run_lockstep(run: LockstepRun, targets: dict[str | None, Target],
                 say: Callable[[str], None] = print) -> list[dict]:
    """The runs, one dict per repeat: each lane's record with `x_plain`, and `order`.
    `targets[None]` is the default precision's target."""
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in run.lengths]
    names = [lane.label for lane in run.lanes]
    runs = []
    for rep in range(run.repeats):
        order = run.lanes[rep % len(run.lanes):] + run.lanes[: rep % len(run.lanes)]
        lanes = []
        for spec in order:
            engine = make_engine(targets[spec.precision], spec, run.concurrency)
            engine.generate(run.prompts[: run.concurrency], SamplingParams(max_tokens=8, ignore_eos=True))  # warm-up
            if engine.runner.drafter is not None:
                for reply in run.warm_replies:
                    engine.runner.drafter.remember_reply(reply)
            lanes.append(Lane(spec.label, engine, run.prompts, params, run.concurrency))
        rnd = 0
        while not all(lane.done() for lane in lanes):
            for lane in lanes if rnd % 2 == 0 else lanes[::-1]:
                if not lane.done():
                    lane.step()
            rnd += 1
        result: dict = {lane.name: lane.record() for lane in lanes}
        result["order"] = [spec.label for spec in order]
        for name in names:
            result[name]["x_plain"] = result["plain"]["seconds"] / result[name]["seconds"]
        runs.append(result)
        say(f"repeat {rep + 1}/{run.repeats}: " + "  ".join(
            f"{n} {result[n]['tok_s']:.1f} tok/s x{result[n]['x_plain']:.3f} ({result[n]['speculated_steps']}/"
            f"{result[n]['steps']} steps speculated; {1e3 * result[n]['target_seconds'] / result[n]['steps']:.2f} "
            f"ms target, {1e3 * (result[n]['seconds'] - result[n]['target_seconds']) / result[n]['steps']:.2f} ms "
            "outside)" for n in names))
        for lane in lanes:
            # the two governors' summaries: speculation against plain decoding, and the
            # drafter against prompt lookup alone
            if lane.engine.speculate_or_plain is not None:
                say(f"  {lane.name} speculate or plain " + json.dumps(lane.engine.speculate_or_plain.summary()))
            if lane.engine.drafter_or_lookup is not None:
                say(f"  {lane.name} drafter or lookup " + json.dumps(lane.engine.drafter_or_lookup.summary()))
    return runs


def summarize(runs: list[dict], names: list[str]) -> dict:
    out = {}
    for name in names:
        x = [r[name]["x_plain"] for r in runs]
        tok_s = [r[name]["tok_s"] for r in runs]
        out[name] = {"x_plain_median": statistics.median(x), "x_plain_min": min(x), "x_plain_max": max(x),
                     "tok_s": tok_s, "tok_s_median": statistics.median(tok_s)}
    return out


def prompt_lengths(num: int, max_tokens: int, spread: float) -> list[int]:
    """Each prompt's own output length, drawn once (fixed seed) from max_tokens x
    [1 - spread, 1 + spread], the same for every configuration: served requests differ
    in length, and with every request equally long plain decoding's requests finish
    together and are prefilled in one step while speculation's drift apart."""
    rng = random.Random(0)
    return [max(1, round(max_tokens * (1 + spread * rng.uniform(-1, 1)))) for _ in range(num)]
