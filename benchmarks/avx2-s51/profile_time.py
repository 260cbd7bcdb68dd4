"""What the priced drafterless default costs on a target's first use: the step-time
profile at one request (into an empty profile directory), then loading it back.

    python3 benchmarks/avx2-s51/profile_time.py [MODEL]
"""
import glob
import os
import sys
import tempfile
import time
from pathlib import Path

import dspark.profiling.measure as measure
from dspark.profiling.tables import load_or_profile
from dspark.runtime.target import Target

model = sys.argv[1] if len(sys.argv) > 1 else glob.glob(os.path.expanduser("~/.cache/dspark/models/qwen2.5-coder-0.5b-instruct-*"))[0]
target = Target.load(model, dtype="auto", device="cpu", max_len=2048)
with tempfile.TemporaryDirectory() as d:
    measure.profile_dir = lambda: Path(d)
    t = time.perf_counter()
    load_or_profile(target, None, 1, 7, quiet=True)
    print(f"first use (profiled): {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    load_or_profile(target, None, 1, 7, quiet=True)
    print(f"again (from the cache, spot-checked): {time.perf_counter() - t:.1f} s")
