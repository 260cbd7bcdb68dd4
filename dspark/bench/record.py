"""A served sweep as a results record (`dspark bench record`): one JSON line appended to
`benchmarks/results/<question>.jsonl`, from which docs/performance.md is rewritten.

The record takes its date, commit and CPU from the sweep's own provenance (written by
`dspark bench sweep` when it ran), its numbers from sweep.json (medians over rounds
with their range; ratios paired by round), and only the reading of them from the
person recording. A sweep whose prompts repeated, whose code had uncommitted changes
or with a failed configuration is refused unless that is asked for, and then the
summary says so. Imports no torch.
"""

from __future__ import annotations

import json
from pathlib import Path

from dspark.errors import UserError

from .performance_doc import DOC, QUESTIONS, RESULTS, check_record, load, render


class RecordRefused(UserError):
    """The sweep cannot be recorded as asked (the message says why and what to do)."""


def _triple(median: float, spread: list | None, digits: int) -> list[float]:
    lo, hi = spread if spread else (median, median)
    return [round(median, digits), round(lo, digits), round(hi, digits)]


def _fmt_ratio(r: list[float]) -> str:
    return f"{r[0]:.2f} [{r[1]:.2f}-{r[2]:.2f}]" if r[1] != r[2] else f"{r[0]:.2f}"


def sweep_numbers(result: dict) -> dict:
    """The `results` of a record: output tok/s [median, min, max] per configuration and
    concurrency, and each configuration against the reference, paired by round."""
    concurrencies = sorted({p["concurrency"] for p in result["points"]})
    tok: dict[str, dict[str, list[float]]] = {}
    for p in result["points"]:
        spread = (p.get("spread") or {}).get("output_throughput")
        tok.setdefault(p["config"], {})[str(p["concurrency"])] = _triple(p["output_throughput"], spread, 1)
    ratio: dict[str, dict[str, list[float]]] = {}
    for r in result.get("ratios") or []:
        o = r["output_throughput"]
        ratio.setdefault(f"{r['config']}/{r['reference']}", {})[str(r["concurrency"])] = _triple(
            o["median"], o.get("spread"), 3)
    return {"kind": "served sweep", "concurrency": concurrencies,
            "prompt_repeats": result["sweep"].get("prompt_repeats"), "output_tok_s": tok, "ratio": ratio}


def sweep_summary(result: dict, numbers: dict) -> str:
    """The measured part of a record's summary, one line."""
    s, load_ = result["sweep"], result["sweep"]["load"]
    cs = numbers["concurrency"]
    n = len(result["configs"])
    how = f"all {n} servers up" if s.get("servers") == "together" else f"{n} servers, each started for its turn"
    parts = [f"served, {how}, {s['rounds']} rounds alternating, {s['num_prompts']} prompts a point, "
             f"{load_['max_tokens']} tokens" + (", ignore_eos" if load_.get("ignore_eos") else "")
             + (f", temperature {load_['temperature']:g}" if load_.get("temperature") else ", greedy")
             + f", dataset {load_.get('dataset_path') or load_['dataset']}"]
    repeats = numbers["prompt_repeats"]
    parts.append("no prompt sent twice in the run" if repeats == "none" else f"PROMPTS REPEATED ({repeats})")
    at = " / ".join(str(c) for c in cs)
    tok = "; ".join(f"{name} " + " / ".join(f"{v[str(c)][0]:.1f}" if str(c) in v else "-" for c in cs)
                    for name, v in numbers["output_tok_s"].items())
    parts.append(f"output tok/s median, c = {at}: {tok}")
    if numbers["ratio"]:
        ref = next(iter(numbers["ratio"])).split("/", 1)[1]
        rat = "; ".join(f"{key.split('/', 1)[0]} " + " / ".join(_fmt_ratio(v[str(c)]) if str(c) in v else "-"
                                                               for c in cs)
                        for key, v in numbers["ratio"].items())
        parts.append(f"x {ref} paired by round: {rat}")
    return "; ".join(parts)


def record_from_sweep(result: dict, note: str = "", command: str | None = None, allow_repeats: bool = False,
                      allow_dirty: bool = False) -> dict:
    """The record of one sweep.json (refused with the reason where it should not be one)."""
    if not isinstance(result, dict) or not {"sweep", "configs", "points"} <= set(result):
        raise RecordRefused("not a sweep.json written by `dspark bench sweep`")
    failed = [c["name"] for c in result["configs"] if c.get("status") != "ok"]
    if failed:
        raise RecordRefused(f"configurations failed in this sweep ({', '.join(failed)}): measure again")
    if not result["points"]:
        raise RecordRefused("the sweep holds no measured point")
    prov = result["sweep"].get("provenance")
    if not prov or not prov.get("commit"):
        raise RecordRefused("the sweep does not say which commit and CPU measured it (a sweep from before "
                            "`dspark bench sweep` kept its provenance, sweeps of several commits or CPUs merged, "
                            "or one run outside a git checkout): record each sweep from a checkout")
    caveats = []
    if prov.get("dirty"):
        if not allow_dirty:
            raise RecordRefused(f"the sweep ran with uncommitted changes to dspark/ on top of {prov['commit']}: "
                                f"commit them and measure again, or pass --allow-dirty (the summary says so)")
        caveats.append(f"measured with uncommitted changes on top of {prov['commit']}")
    numbers = sweep_numbers(result)
    if numbers["prompt_repeats"] != "none":
        if not allow_repeats:
            raise RecordRefused(f"prompts repeated within the sweep ({numbers['prompt_repeats']}): a server's "
                                f"prefix cache or reply history may have hit; measure again with fewer "
                                f"--num-prompts, --rounds or concurrencies, or pass --allow-repeats")
    command = command or prov.get("command")
    if not command:
        raise RecordRefused("the sweep kept no command line: give the one that ran it with --command")
    summary = sweep_summary(result, numbers)
    for extra in caveats + ([note.strip()] if note and note.strip() else []):
        summary += f"; {extra}"
    return {"date": prov["date"], "commit": prov["commit"], "cpu": prov["cpu"], "command": command,
            "summary": summary, "results": numbers}


def append_record(record: dict, question: str, results: Path = RESULTS, doc: Path | None = DOC) -> Path:
    """Append `record` to the question's file (checked first) and rewrite `doc` from all
    records; returns the file written."""
    if question not in QUESTIONS:
        raise RecordRefused(f"unknown question {question!r}; one of: {', '.join(QUESTIONS)}")
    check_record(record, "the new record")
    path = results / f"{question}.jsonl"
    lines = [line for line in (path.read_text().splitlines() if path.exists() else []) if line.strip()]
    # the files run oldest to newest: after every record of its date or earlier
    at = len(lines)
    while at and json.loads(lines[at - 1])["date"] > record["date"]:
        at -= 1
    lines.insert(at, json.dumps(record, ensure_ascii=False))
    path.write_text("\n".join(lines) + "\n")
    if doc is not None:
        doc.write_text(render(load(results)))
    return path
