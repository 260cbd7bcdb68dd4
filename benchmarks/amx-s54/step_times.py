import torch
from dspark.runtime.target import Target
from dspark.profiling.measure import measure_step_times
counts = [1, 2, 4, 8, 16, 32, 64]
ts = {p: Target.load("default", dtype=p, device="cpu", max_len=512) for p in ("bf16w", "bf16x")}
for r in range(2):
    for p, t in ts.items():
        ms = measure_step_times(t, counts, context_len=128, tokens_per_request=1, repeats=5, passes=1)
        print(r, p, " ".join(f"{n}:{m:.1f}" for n, m in zip(counts, ms)), flush=True)
