"""Exactness on the kernels of the other CPU kinds, run on this one.

A CPU picks its kernels once per process: AVX2 or AVX-512 for bf16w, AMX tiles or
avx512_bf16 dot products for bf16x. The suite's other tests run whatever this CPU
picks; here a fresh process is told to pick what another kind of CPU would
(`DSPARK_GEMM_ISA=avx2`: an AVX2-only CPU's bf16w kernel; `DSPARK_NO_AMX=1`: the
bf16x kernel of a CPU with avx512_bf16 but no AMX, which does not give AMX's bits),
and greedy speculative decoding (DSpark, Eagle3, hybrid lookup + DSpark with adaptive
verification) and chunked prefill are checked against plain greedy decoding in the
same process: the same tokens, every one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dspark.runtime import cpu_kernels, cpu_matmul

CHILD = r"""
import json, sys
from dspark.engine.config import SpeculativeConfig
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.generate import generate_plain
from dspark.runtime import cpu_kernels, cpu_matmul
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams

target = Target.load("default", dtype=sys.argv[1], device="cpu", max_len=1024)
questions = ["How many legs do three spiders have?", "Write a Python function that reverses a string.",
             "What is 17 * 23? Think step by step.", "Name three rivers in Europe and one fact about each.",
             "Explain what a hash table is in two sentences."]
prompts = [target.tokenizer.chat_prompt(q) for q in questions]
params = SamplingParams(max_tokens=32)
refs = [generate_plain(target, p, params).token_ids for p in prompts]
out = {"bf16x_kernel": cpu_matmul.bf16x_kernel(), "gemm_isa": cpu_matmul.gemm_isa(), "precision": target.model.precision}
configs = {
    "dspark": ({"method": "dspark", "num_speculative_tokens": 7}, 512),
    "eagle3": ({"method": "eagle3", "num_speculative_tokens": 7}, 512),
    "hybrid": ({"method": "dspark", "lookup": True, "enable_adaptive_verification": True}, 512),
    "dspark-chunked": ({"method": "dspark", "num_speculative_tokens": 5}, 7),
    "plain-chunked": (None, 7),
}
for name, (spec, chunk) in configs.items():
    engine = LLMEngine(target, SpeculativeConfig(**spec) if spec else None,
                       EngineConfig(max_num_seqs=8, max_model_len=512, max_prefill_tokens=chunk))
    seqs = engine.generate(prompts, params)
    out[name] = [i for i, (s, r) in enumerate(zip(seqs, refs)) if s.output_ids != r]  # the prompts that differ
print("RESULT " + json.dumps(out))
"""


def _run(precision: str, **env: str) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, precision], capture_output=True, text=True, timeout=600,
                       env={**os.environ, **env})
    assert r.returncode == 0, r.stderr[-3000:]
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


VARIANTS = [
    # bf16w as an AVX2-only CPU runs it (the precision `auto` picks there)
    pytest.param("bf16w", {"DSPARK_GEMM_ISA": "avx2"}, ("gemm_isa", "avx2"), id="bf16w-avx2",
                 marks=pytest.mark.skipif(not cpu_kernels.available(), reason="native kernels unavailable")),
    # bf16x on avx512_bf16 dot products, as a CPU without AMX runs it
    pytest.param("bf16x", {"DSPARK_NO_AMX": "1"}, ("bf16x_kernel", "avx512_bf16"), id="bf16x-no-amx",
                 marks=pytest.mark.skipif(not cpu_matmul.bf16dot_available(), reason="no avx512_bf16 here")),
]


@pytest.mark.slow
@pytest.mark.parametrize("precision,env,kernel", VARIANTS)
def test_other_cpu_kinds_kernels_keep_greedy_speculation_exact(precision, env, kernel):
    out = _run(precision, **env)
    assert out["precision"] == precision and out[kernel[0]] == kernel[1], out  # the variant really ran
    for name in ("dspark", "eagle3", "hybrid", "dspark-chunked", "plain-chunked"):
        assert out[name] == [], (name, out)
