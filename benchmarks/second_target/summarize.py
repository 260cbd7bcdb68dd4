"""Markdown tables from what measure.sh wrote (runs/measure-s30 by default)."""

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

M = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/measure-s30")


def acceptance(name):
    f = M / name
    if not f.is_file():
        return
    rows = defaultdict(dict)
    for line in f.read_text().splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            rows[r["drafter"]][r["domain"]] = r
    print(f"\n{name}\n\n| drafter | math | code | chat | all | first token |\n|---|---:|---:|---:|---:|---:|")
    for d, doms in rows.items():
        rounds = sum(r["rounds"] for r in doms.values())
        tok = sum(r["acceptance_length"] * r["rounds"] for r in doms.values())
        first = statistics.mean(r["per_position"][0] for r in doms.values())
        cells = " | ".join(f"{doms[k]['acceptance_length']:.2f}" if k in doms else "–" for k in ("math", "code", "chat"))
        print(f"| {d} | {cells} | {tok / rounds:.2f} | {first:.2f} |")


def startup():
    f = M / "startup.txt"
    if not f.is_file():
        return
    vals = defaultdict(list)
    for line in f.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            vals[parts[0]].append(float(parts[1]))
    print("\nstart-up (s, median [min-max] of 5):")
    for k, v in vals.items():
        print(f"  {k}: {statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]")


def profile(label, files):
    curves = []
    for f in files:
        d = json.loads(Path(f).read_text())
        curves.append(dict(zip(d["token_counts"], d["step_ms"])))
    if not curves:
        return
    pts = [n for n in (1, 2, 4, 6, 7, 8, 12, 13, 16) if n in curves[0]]
    med = {n: statistics.median(c[n] for c in curves) for n in pts}
    print(f"| {label} | " + " | ".join(f"{med[n]:.1f}" for n in pts) + f" | {med[8] / med[1]:.2f} |")
    return pts


print(M)
acceptance("eval-D.jsonl")
acceptance("eval-Q.jsonl")
startup()
header = None
print()
for label, pattern in (("second target (auto)", "profile-Q.json"), ("default, bf16w AVX-512", "profile-default-avx512-*.json"),
                       ("default, bf16w AVX2", "profile-default-avx2-*.json")):
    files = sorted(M.glob(pattern))
    if files and header is None:
        d = json.loads(files[0].read_text())
        header = [n for n in (1, 2, 4, 6, 7, 8, 12, 13, 16) if n in d["token_counts"]]
        print("| step (ms) | " + " | ".join(f"T({n})" for n in header) + " | T(8)/T(1) |")
        print("|---|" + "---:|" * (len(header) + 1))
    if files:
        profile(label, files)
