"""The DSpark draft call before (e7373d0) and after that session's change, on a draft
captured in a running engine (3 requests): 200 randomized comparisons (greedy and
sampled, lookup proposals of random length and confidence) must give the same tokens,
logits and lookup counts, then both are timed, called alternately. The harness is
`scripts/bench_draft_ab.py` (this file ran it with its own copy before it existed).

    python3 benchmarks/avx2-s46/draft_ab.py
"""
import runpy
import sys
from pathlib import Path

sys.argv = ["bench_draft_ab.py", "--before", "e7373d0", "--requests", "3", "--trials", "200"]
runpy.run_path(str(Path(__file__).resolve().parents[2] / "scripts" / "bench_draft_ab.py"), run_name="__main__")
