"""Each lane's time by its position in the stepping order, from a bench_lockstep.py
JSON of identical lanes (plain, plain-again, plain-b, plain-c): the time of the lane at
each position over the mean of the run's lanes. The outer positions step twice in a
row where the order reverses.

    python3 benchmarks/avx2-s52/lane_positions.py benchmarks/avx2-s52/lanes_c4.json
"""
import json
import statistics
import sys

runs = json.load(open(sys.argv[1]))["runs"]
by_pos = {}
for run in runs:
    order = run["order"]
    mean = statistics.mean(run[n]["seconds"] for n in order)
    for pos, name in enumerate(order):
        by_pos.setdefault(pos, []).append(run[name]["seconds"] / mean)
    print("  ".join(f"{name} {run[name]['seconds'] / mean:.4f}" for name in order))
for pos, xs in sorted(by_pos.items()):
    print(f"position {pos}: time / the run's mean {statistics.mean(xs):.4f} "
          f"[{min(xs):.4f}-{max(xs):.4f}] over {len(xs)} runs")
