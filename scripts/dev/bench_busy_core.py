"""Decoding speed with one CPU core taken by another process.

Usage: python scripts/dev/bench_busy_core.py [--max-tokens 64]

Runs the engine (`LLMEngine.run`, one request, greedy, the default model, `--dtype
auto`) quietly without speculation, then starts a busy loop in another process (one
core taken) and runs it again without speculation and with the shipped DSpark drafter
(adaptive verification). Prints ms per output token for each; each run is a fresh
process, so thread counts start from the default.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

RUN = r"""
import sys, time
from dspark.engine.config import EngineConfig, SpeculativeConfig
from dspark.engine.engine import LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams
t = Target.load("default", dtype="auto", log=lambda line: None)
spec = None if sys.argv[1] == "none" else SpeculativeConfig(method="dspark", enable_adaptive_verification=True)
eng = LLMEngine(t, spec, EngineConfig())
ids = t.tokenizer.apply_chat_template([{"role": "user", "content": "Explain how a hash map works, with an example in Python."}])
p = SamplingParams(temperature=0, max_tokens=int(sys.argv[2]), ignore_eos=True)
list(eng.run([(0, ids, p)]))
t0 = time.perf_counter()
list(eng.run([(1, ids, p)]))
print((time.perf_counter() - t0) / p.max_tokens * 1000)
"""


def run(method: str, max_tokens: int) -> float:
    out = subprocess.run([sys.executable, "-c", RUN, method, str(max_tokens)], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    print(f"plain, quiet: {run('none', args.max_tokens):.1f} ms/token", flush=True)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1)
        print(f"plain, one core taken: {run('none', args.max_tokens):.1f} ms/token", flush=True)
        print(f"dspark adaptive, one core taken: {run('dspark', args.max_tokens):.1f} ms/token", flush=True)
    finally:
        busy.kill()


if __name__ == "__main__":
    main()
