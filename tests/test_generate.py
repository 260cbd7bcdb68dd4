"""Plain generation against transformers' greedy generate, and the CLI's behaviour."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from dspark.generate import generate_plain
from dspark.sampling import SamplingError, SamplingParams

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Give three tips for staying healthy.",
    "Explain what a hash table is in one paragraph.",
    "Translate 'good morning' into Spanish and German.",
    "What is 17 times 23?",
    "Write a short poem about autumn leaves.",
    "List the planets of the solar system in order.",
    "Why is the sky blue?",
]


@pytest.mark.slow
def test_greedy_generate_equals_transformers(default_target_fp32):
    from transformers import AutoModelForCausalLM

    target = default_target_fp32
    hf = AutoModelForCausalLM.from_pretrained(str(target.path), dtype=torch.float32).eval()
    n_new = 24
    for prompt in PROMPTS:
        ids = target.tokenizer.chat_prompt(prompt)
        ours = generate_plain(target, ids, SamplingParams(max_tokens=n_new))
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=n_new, do_sample=False, pad_token_id=2)
        ref_ids = ref[0, len(ids):].tolist()
        if 2 in ref_ids:  # transformers keeps the end-of-turn token; we stop before it
            ref_ids = ref_ids[: ref_ids.index(2)]
        assert ours.token_ids == ref_ids, prompt


@pytest.mark.slow
def test_seeded_sampling_is_reproducible(default_target):
    ids = default_target.tokenizer.chat_prompt("Tell me a story.")
    p = dict(temperature=0.9, top_p=0.9, top_k=50, max_tokens=16, ignore_eos=True)
    a = generate_plain(default_target, ids, SamplingParams(seed=3, **p))
    b = generate_plain(default_target, ids, SamplingParams(seed=3, **p))
    c = generate_plain(default_target, ids, SamplingParams(seed=4, **p))
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


@pytest.mark.slow
def test_stop_string_cuts_output(default_target):
    ids = default_target.tokenizer.chat_prompt("What is the capital of France?")
    full = generate_plain(default_target, ids, SamplingParams(max_tokens=12, ignore_eos=True))
    word = full.text.split()[2]
    cut = generate_plain(default_target, ids, SamplingParams(max_tokens=12, stop=[word], ignore_eos=True))
    assert cut.finish_reason == "stop"
    assert word not in cut.text and full.text.startswith(cut.text)


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.5), dict(top_p=0.0), dict(top_p=1.5),
                                    dict(top_k=-1), dict(max_tokens=0)])
def test_invalid_sampling_values(kwargs):
    with pytest.raises(SamplingError):
        SamplingParams(**kwargs)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dspark.cli.main", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_cli_json_output():
    r = _cli("generate", "Say hello.", "--max-tokens", "8", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {"text", "token_ids", "num_output_tokens", "tokens_per_s"} <= out.keys()
    assert out["num_output_tokens"] == len(out["token_ids"]) <= 8


@pytest.mark.parametrize("args,needle", [
    (["generate", "hi", "--model", "/no/such/dir"], "not a directory"),
    (["generate", "hi", "--temperature", "-1"], "temperature"),
    (["generate", "hi", "--top-p", "2"], "top_p"),
    (["generate", "word " * 300, "--max-model-len", "64"], "context"),
    (["generate", "hi", "--speculative-config", "{bad"], "not valid JSON"),
])
def test_cli_bad_input_is_one_clear_line(args, needle):
    r = _cli(*args)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert needle in r.stderr
