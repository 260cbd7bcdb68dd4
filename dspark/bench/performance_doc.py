"""docs/performance.md, written from the measurement records in benchmarks/results/.

Every run that gave a number the project quotes is one JSON line in
`benchmarks/results/<question>.jsonl` with the date, the commit that recorded it,
the CPU it ran on, the command and a one-line summary. This module checks those
records and renders them; it imports no torch and nothing of the engine.

    python3 -m dspark.bench.performance_doc            # rewrite docs/performance.md
    python3 -m dspark.bench.performance_doc --check    # exit 1 if it is out of date

The headline table (the README's "How fast") is the latest served sweep on each CPU
kind that ran our plain decoding (`none`), the default and llama.cpp's plain server
at 1, 4, 16 and 32 requests.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "performance.md"

#: The questions, in the order the document answers them: file stem -> title.
QUESTIONS: dict[str, str] = {
    "default-vs-plain": "Does the default beat plain decoding?",
    "peers": "Against llama.cpp and vLLM",
    "acceptance": "How much do the drafters accept?",
    "step-time": "What does a step of n tokens cost (the step-time curve)?",
    "training": "How fast does training run?",
    "reliability": "Does the server hold up (fuzzing, soak, overload)?",
    "runtime": "Precisions and the runtime",
    "quantized": "Quantized GGUF files served as stored",
}
REQUIRED = ("date", "commit", "cpu", "command", "summary")
CONCURRENCIES = (1, 4, 16, 32)
#: CPU kinds in the order the headline table lists them.
CPU_ORDER = ("AVX2 EPYC", "avx512_bf16 EPYC", "AMX Xeon")
#: Records shown in full per question; the rest are counted and left to the file.
SHOWN = 15


class RecordError(ValueError):
    """A results record lacks a field or carries one in the wrong form."""


def check_record(record: dict, where: str) -> None:
    for key in REQUIRED:
        if not record.get(key):
            raise RecordError(f"{where}: no {key!r}; every record needs {', '.join(REQUIRED)}")
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(record["date"])):
        raise RecordError(f"{where}: date {record['date']!r} is not YYYY-MM-DD")
    if not re.fullmatch(r"[0-9a-f]{7,40}", str(record["commit"])):
        raise RecordError(f"{where}: commit {record['commit']!r} is not a git hash")
    cpu = record["cpu"]
    if not isinstance(cpu, dict) or not cpu.get("kind") or "flags" not in cpu:
        raise RecordError(f"{where}: cpu must be an object with 'kind' and 'flags'")


def load(results: Path = RESULTS) -> dict[str, list[dict]]:
    """Every record of every question, newest first, checked."""
    out: dict[str, list[dict]] = {}
    for path in sorted(results.glob("*.jsonl")):
        if path.stem not in QUESTIONS:
            raise RecordError(f"{path}: unknown question {path.stem!r} (known: {', '.join(QUESTIONS)})")
        records = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            record = json.loads(line)
            check_record(record, f"{path.name}:{n}")
            records.append(record)
        # newest first: by date, and within a day the later line (records are appended)
        out[path.stem] = [r for _, r in sorted(enumerate(records), key=lambda ir: (ir[1]["date"], ir[0]),
                                                reverse=True)]
    return out


def _cpu(record: dict) -> str:
    cpu = record["cpu"]
    flags = ", ".join(cpu.get("flags") or [])
    return f"{cpu['kind']} ({flags})" if flags else cpu["kind"]


def headline(records: dict[str, list[dict]]) -> tuple[list[str], list[dict]]:
    """The how-fast table's lines and the records it was taken from."""
    chosen: dict[str, dict] = {}
    for record in records.get("peers", []):
        res = record.get("results") or {}
        tok, ratio = res.get("output_tok_s") or {}, (res.get("ratio") or {}).get("default/none") or {}
        if not all(name in tok for name in ("none", "default", "llama.cpp")):
            continue
        if not all(str(c) in ratio and str(c) in tok["llama.cpp"] for c in CONCURRENCIES):
            continue
        kind = record["cpu"]["kind"]
        if kind not in chosen:  # newest first
            chosen[kind] = record
    lines = [
        "| CPU (2 cores) | requests | plain tok/s | default tok/s | default ÷ plain [range] | llama.cpp plain tok/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    used = []
    for kind in sorted(chosen, key=lambda k: CPU_ORDER.index(k) if k in CPU_ORDER else len(CPU_ORDER)):
        record = chosen[kind]
        used.append(record)
        tok = record["results"]["output_tok_s"]
        ratio = record["results"]["ratio"]["default/none"]
        for c in CONCURRENCIES:
            k = str(c)
            med, lo, hi = ratio[k]
            lines.append(
                f"| {kind} | {c} | {tok['none'][k][0]:.1f} | {tok['default'][k][0]:.1f} "
                f"| {med:.2f}× [{lo:.2f}–{hi:.2f}] | {tok['llama.cpp'][k][0]:.1f} |"
            )
    return lines, used


def headline_sources(used: list[dict]) -> str:
    return "; ".join(f"{r['cpu']['kind']}: {r['date']}, commit {r['commit']}" for r in used)


def render(records: dict[str, list[dict]]) -> str:
    lines = [
        "# Performance",
        "",
        "Generated by `python3 -m dspark.bench.performance_doc` from `benchmarks/results/*.jsonl`;",
        "do not edit by hand (a test checks that it is up to date). Each record names the date,",
        "the commit that recorded the run, the CPU and the command (in the `.jsonl` file);",
        "`benchmarks/README.md` lists the questions and how to measure each again. The story",
        "behind the numbers, newest first: `docs/journal.md`.",
        "",
        "## How fast, served",
        "",
        "Output tokens per second of all requests together, our plain decoding (`--speculative-config none`)",
        "against the default configuration and llama.cpp's plain server on the bf16 GGUF of the same",
        "weights, all servers up at once and taking turns round by round (`dspark bench sweep`, 32 new",
        "held-out prompts a point each round, 64 greedy tokens); medians over rounds, the ratio paired",
        "within rounds with its range.",
        "",
    ]
    table, used = headline(records)
    lines += table
    lines += ["", f"Records: {headline_sources(used)} (`benchmarks/results/peers.jsonl`).", ""]
    for question, title in QUESTIONS.items():
        recs = records.get(question, [])
        if not recs:
            continue
        lines += [f"## {title}", "", f"`benchmarks/results/{question}.jsonl`: {len(recs)} records, newest first.", ""]
        for record in recs[:SHOWN]:
            lines.append(f"- **{record['date']}, {record['commit']}, {_cpu(record)}.** {record['summary']}")
        if len(recs) > SHOWN:
            lines.append(f"- … {len(recs) - SHOWN} earlier records in the file.")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m dspark.bench.performance_doc", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 when docs/performance.md is out of date")
    p.add_argument("--out", type=Path, default=DOC)
    args = p.parse_args(argv)
    text = render(load())
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} is out of date: run python3 -m dspark.bench.performance_doc", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
