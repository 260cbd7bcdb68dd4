"""The engine of two source trees on the same requests, stepped in turn: whole batches of
held-out prompts (prefill, decoding, speculation as configured), not one product.

Two worker processes stay up, each importing dspark from its own tree (PYTHONPATH) and
loading the same model with `--dtype auto`. Each round adds the same new prompts (`mixed`
held-out set, `--concurrency` of them, never one twice in the run) to both engines, then
steps them alternately, one engine step each, the order reversed every step, until both
are done; each sums the seconds its own steps took. Drift over a step (milliseconds) falls
on both alike, so a round's ratio resolves a few per cent where whole runs taken one after
the other drift by tens. Reported per round and as the median [min-max] of B/A speed.

    git worktree add /tmp/base HEAD~3
    python3 scripts/dev/bench_engine_trees.py /tmp/base . --model F.gguf --concurrency 16 --rounds 8
    python3 scripts/dev/bench_engine_trees.py /tmp/base . --model F.gguf --concurrency 1 --speculative default
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

WORKER = r"""
import json, sys, time
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import EngineConfig, parse_speculative_arg, resolve_speculative
from dspark.engine.engine import LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams
model, spec = sys.argv[1], sys.argv[2]
t = Target.load(model, dtype="auto", log=lambda line: None)
eng = LLMEngine(t, resolve_speculative(parse_speculative_arg(spec), t), EngineConfig())
prompts = heldout_prompts("mixed", None)
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "add":
        first, n, max_tokens = int(cmd[1]), int(cmd[2]), int(cmd[3])
        for p in prompts[first:first + n]:
            ids = t.tokenizer.apply_chat_template(p.chat_messages())
            eng.add_request(ids, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
        print("ok", flush=True)
    else:
        a = time.perf_counter(); out = eng.step(); b = time.perf_counter()
        print(json.dumps([b - a, sum(len(o.new_tokens) for o in out), eng.has_unfinished()]), flush=True)
"""


class Worker:
    def __init__(self, tree: Path, model: str, spec: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, model, spec], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                                     cwd="/")
        if self.proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"the engine of {tree} did not start (run it by hand to see why)")

    def ask(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tree_a", type=Path, help="the baseline tree (a git worktree)")
    ap.add_argument("tree_b", type=Path, help="the tree measured against it")
    ap.add_argument("--model", required=True, help="a model directory or GGUF file")
    ap.add_argument("--concurrency", type=int, default=16, help="requests a round adds at once (default 16)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--first-prompt", type=int, default=0, help="where in the held-out set the run starts")
    ap.add_argument("--speculative", default="none", help="none (default), default, or a JSON config")
    args = ap.parse_args()
    # the workers run from / (so that neither imports the dspark of the current directory)
    model = str(Path(args.model).resolve()) if Path(args.model).exists() else args.model
    workers = [Worker(args.tree_a, model, args.speculative), Worker(args.tree_b, model, args.speculative)]
    ratios = []
    try:
        for r in range(args.rounds):
            first = args.first_prompt + r * args.concurrency
            for w in workers:
                w.ask(f"add {first} {args.concurrency} {args.max_tokens}")
            seconds, tokens, live, k = [0.0, 0.0], [0, 0], [True, True], 0
            while any(live):
                for i in ((0, 1) if k % 2 == 0 else (1, 0)):
                    if live[i]:
                        dt, n, live[i] = json.loads(workers[i].ask("step"))
                        seconds[i] += dt
                        tokens[i] += n
                k += 1
            if tokens[0] == 0:
                raise SystemExit(f"no prompts left at {first}: lower --rounds or --first-prompt")
            ratios.append(seconds[0] / seconds[1])
            print(f"round {r}: A {tokens[0] / seconds[0]:.1f} tok/s  B {tokens[1] / seconds[1]:.1f} tok/s  "
                  f"B/A speed {ratios[-1]:.3f}", flush=True)
    finally:
        for w in workers:
            w.proc.kill()
    print(f"B/A speed: median {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}] "
          f"over {len(ratios)} rounds")


if __name__ == "__main__":
    main()
