"""The tables of scripts/train/judge_levers.sh's outputs (Markdown, for the journal).

    python3 scripts/train/judge_table.py runs/levers/judge
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(judge: Path) -> None:
    rows = [json.loads(line) for line in (judge / "acceptance.jsonl").read_text().splitlines() if line.strip()]
    by: dict[str, dict[str, dict]] = {}
    for r in rows:
        by.setdefault(r["drafter"], {})[r["domain"]] = r
    domains = sorted({r["domain"] for r in rows})
    print("| drafter | " + " | ".join(f"τ {d}" for d in domains) + " | τ mean | first-token acceptance |")
    print("|---|" + "---:|" * (len(domains) + 2))
    for name, per in by.items():
        taus = [per[d]["acceptance_length"] for d in domains if d in per]
        first = [per[d]["conditional"][0] for d in domains if d in per and per[d]["conditional"]]
        print(f"| {name} | " + " | ".join(f"{t:.3f}" for t in taus)
              + f" | {sum(taus) / len(taus):.3f} | {sum(first) / max(len(first), 1):.3f} |")
    for f in sorted(judge.glob("calibrate-*.json")):
        try:
            rep = json.loads(f.read_text())
        except ValueError:
            continue
        b, a = rep["before"], rep["after"]
        print(f"\n{f.stem.removeprefix('calibrate-')}: ECE at position 1 {100 * b['per_position_ece'][0]:.1f} % raw "
              f"-> {100 * a['per_position_ece'][0]:.1f} % STS (T1 {rep['temperatures'][0]:.2f}); overall "
              f"{100 * b['ece']:.1f} % -> {100 * a['ece']:.1f} %")
    engine = judge / "engine-c1.json"
    if engine.is_file():
        d = json.loads(engine.read_text())
        print("\n| configuration | × plain [range] | tok/s |")
        print("|---|---:|---:|")
        for name, s in d["summary"].items():
            print(f"| {name} | {s['x_plain_median']:.3f} [{s['x_plain_min']:.3f}–{s['x_plain_max']:.3f}] "
                  f"| {s['tok_s_median']:.1f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/levers/judge"))
