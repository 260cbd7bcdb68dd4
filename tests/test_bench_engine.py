"""`dspark bench engine` (dspark.eval.lockstep): configurations named, parsed and
stepped in turn on a tiny model; every lane does the same work, and the switches
(`+uncached`) reach the engine's real config."""

from __future__ import annotations

import pytest
import torch
from test_train import write_tiny_target

from dspark.eval.lockstep import ENGINE_CONFIGS, LaneSpec, LockstepRun, make_engine, prompt_lengths, run_lockstep
from dspark.presets import PRESETS
from dspark.runtime.target import Target


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Target:
    path = write_tiny_target(tmp_path_factory.mktemp("tiny") / "target")  # with a tokenizer, as Target needs
    return Target.load(str(path), dtype="fp32", device="cpu", max_len=256)


def test_configs_are_the_presets_and_real_switches() -> None:
    assert all(ENGINE_CONFIGS[name] == cfg for name, cfg in PRESETS.items())
    lane = LaneSpec.parse("lookup+uncached@bf16w", ENGINE_CONFIGS)
    assert (lane.speculative, lane.precision, lane.prefix_caching) == ({"method": "ngram"}, "bf16w", False)
    for bad in ("nothing", "lookup+other"):
        with pytest.raises(ValueError, match="unknown configuration"):
            LaneSpec.parse(bad, ENGINE_CONFIGS)


def test_lanes_do_the_same_work(tiny: Target) -> None:
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 60, (12,), generator=g).tolist() for _ in range(4)]
    lanes = [LaneSpec.parse(n, ENGINE_CONFIGS) for n in ("plain", "lookup", "plain-again+uncached")]
    run = LockstepRun(lanes, prompts, prompt_lengths(4, 10, 0.5), concurrency=2, repeats=2)
    lines: list[str] = []
    runs = run_lockstep(run, {None: tiny}, say=lines.append)
    assert len(runs) == 2 and runs[1]["order"] == ["lookup", "plain-again+uncached", "plain"]  # rotated
    for r in runs:
        assert r["plain"]["x_plain"] == 1.0
        tokens = {name: r[name]["tok_s"] * r[name]["seconds"] for name in ("plain", "lookup", "plain-again+uncached")}
        assert max(tokens.values()) - min(tokens.values()) < 1e-6 and round(tokens["plain"]) == sum(run.lengths)
        assert r["plain"]["speculated_steps"] == 0
    assert len(lines) == 2


def test_uncached_turns_the_prefix_cache_off(tiny: Target) -> None:
    cached = make_engine(tiny, LaneSpec.parse("plain", ENGINE_CONFIGS), 2)
    uncached = make_engine(tiny, LaneSpec.parse("plain+uncached", ENGINE_CONFIGS), 2)
    assert cached.config.prefix_caching and not uncached.config.prefix_caching
    assert uncached.runner.prefix is None


def test_lengths_are_drawn_once() -> None:
    a, b = prompt_lengths(8, 100, 0.5), prompt_lengths(8, 100, 0.5)
    assert a == b and min(a) >= 50 and max(a) <= 150 and len(set(a)) > 1
    assert prompt_lengths(3, 7, 0.0) == [7, 7, 7]
