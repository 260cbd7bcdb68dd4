"""The measurement library: every results record is complete, docs/performance.md is
generated from the records as they stand, and the README's speed table is theirs."""

import json
import re
from pathlib import Path

import pytest

from dspark.bench import performance_doc as pd

ROOT = Path(__file__).resolve().parents[1]


def test_every_results_record_has_date_commit_cpu_command_and_summary():
    files = sorted((ROOT / "benchmarks" / "results").glob("*.jsonl"))
    assert {f.stem for f in files} == set(pd.QUESTIONS)
    for f in files:
        lines = [line for line in f.read_text().splitlines() if line.strip()]
        assert lines, f"{f.name} has no records"
        for n, line in enumerate(lines, 1):
            pd.check_record(json.loads(line), f"{f.name}:{n}")


def test_records_run_oldest_to_newest_and_the_later_of_a_day_counts_as_newer(tmp_path):
    """Records are appended: a file is in date order, and within a day `load` (newest
    first) puts the later line first, so the headline takes the last sweep of a day."""
    for f in (ROOT / "benchmarks" / "results").glob("*.jsonl"):
        dates = [json.loads(line)["date"] for line in f.read_text().splitlines() if line.strip()]
        assert dates == sorted(dates), f"{f.name} is not in date order (append new records at its end)"
    cpu = {"kind": "AVX2 EPYC", "flags": ["avx2"]}
    rows = [{"date": d, "commit": c, "cpu": cpu, "command": "x", "summary": s}
            for d, c, s in [("2026-12-01", "aaaaaaa", "old"), ("2026-12-02", "bbbbbbb", "morning"),
                            ("2026-12-02", "ccccccc", "evening")]]
    for q in pd.QUESTIONS:
        (tmp_path / f"{q}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [r["summary"] for r in pd.load(tmp_path)["peers"]] == ["evening", "morning", "old"]


def test_a_record_without_a_commit_is_refused():
    record = {"date": "2026-12-06", "cpu": {"kind": "AMX Xeon", "flags": []}, "command": "x", "summary": "y"}
    with pytest.raises(pd.RecordError, match="commit"):
        pd.check_record(record, "here")
    with pytest.raises(pd.RecordError, match="git hash"):
        pd.check_record(record | {"commit": "HEAD~1"}, "here")


def test_performance_md_is_generated_from_the_results_as_they_stand():
    assert (ROOT / "docs" / "performance.md").read_text() == pd.render(pd.load()), (
        "docs/performance.md is out of date: run python3 -m dspark.bench.performance_doc"
    )


def test_the_readmes_speed_table_is_the_records_headline():
    lines, used = pd.headline(pd.load())
    assert len(used) >= 3 and len(lines) == 2 + 4 * len(used)
    readme = (ROOT / "README.md").read_text()
    assert "\n".join(lines) in readme, "README.md's table differs from the records' headline"
    for record in used:
        assert record["commit"] in readme and record["cpu"]["kind"] in readme


def test_no_results_file_or_folder_is_named_by_a_session_counter():
    for path in (ROOT / "benchmarks").rglob("*"):
        assert not re.search(r"-s\d+\b|_\d+$|-rerun|-final", path.stem), path
