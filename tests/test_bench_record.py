"""`dspark bench record`: a sweep (against fake servers, no model) keeps who measured it,
and becomes a results record whose numbers are the sweep's own, refused where the
sweep should not be quoted (repeated prompts, uncommitted code, a failed server)."""

from __future__ import annotations

import copy
import datetime
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dspark.bench.performance_doc import check_record, load
from dspark.bench.record import RecordRefused, append_record, record_from_sweep
from dspark.bench.sweep import merge_results
from dspark.cli.main import main

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai import FakeServer, Machine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("record")
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(8)))
    machine = Machine(drift=0.0)
    with FakeServer("a", 20.0, machine) as url_a, FakeServer("b", 16.0, machine) as url_b:
        assert main(["bench", "sweep", "--out", str(tmp / "s"), "--configs", f"a={url_a}", f"b={url_b}",
                     "--concurrency", "1,2", "--rounds", "2", "--reference", "a", "--dataset-path", str(prompts),
                     "--max-tokens", "8", "--num-prompts", "2", "--num-warmups", "0", "--disable-tqdm",
                     "--tiers", "1"]) == 0
    return tmp / "s"


def _result(sweep: Path, **provenance) -> dict:
    result = json.loads((sweep / "sweep.json").read_text())
    result["sweep"]["provenance"].update(provenance)
    return result


def test_a_sweep_keeps_the_commit_cpu_and_command_that_measured_it(sweep):
    prov = json.loads((sweep / "sweep.json").read_text())["sweep"]["provenance"]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    assert prov["commit"] == (head.stdout.strip() or None)
    assert prov["date"] == datetime.date.today().isoformat()
    assert prov["command"].startswith("dspark bench sweep --out ") and "--rounds 2" in prov["command"]
    assert prov["cpu"]["kind"] and prov["cpu"]["cores"] >= 1 and isinstance(prov["cpu"]["flags"], list)
    assert isinstance(prov["dirty"], bool)


def test_the_record_holds_the_sweeps_own_numbers(sweep):
    result = _result(sweep, dirty=False, commit="abc1234")
    record = record_from_sweep(result, note="fake servers, b 1.25x a")
    check_record(record, "record")
    assert record["commit"] == "abc1234" and record["cpu"] == result["sweep"]["provenance"]["cpu"]
    assert record["command"] == result["sweep"]["provenance"]["command"]
    numbers = record["results"]
    assert numbers["concurrency"] == [1, 2] and numbers["prompt_repeats"] == "none"
    for p in result["points"]:
        lo, hi = p["spread"]["output_throughput"]
        assert numbers["output_tok_s"][p["config"]][str(p["concurrency"])] == [
            round(p["output_throughput"], 1), round(lo, 1), round(hi, 1)]
    for r in result["ratios"]:
        got = numbers["ratio"]["b/a"][str(r["concurrency"])]
        assert got[0] == round(r["output_throughput"]["median"], 3)
        assert got[1] <= got[0] <= got[2]
    s = record["summary"]
    assert s.startswith("served, all 2 servers up, 2 rounds alternating, 2 prompts a point, 8 tokens")
    assert "no prompt sent twice in the run" in s and "c = 1 / 2" in s and "x a paired by round: b " in s
    assert s.endswith("; fake servers, b 1.25x a")


def test_records_go_in_date_order_and_the_document_is_rewritten(sweep, tmp_path):
    record = record_from_sweep(_result(sweep, dirty=False, commit="abc1234", date="2026-12-05"))
    old = {**record, "date": "2026-12-04", "summary": "older"}
    new = {**record, "date": "2026-12-06", "summary": "newer"}
    (tmp_path / "quantized.jsonl").write_text(json.dumps(old) + "\n" + json.dumps(new))  # no final newline
    doc = tmp_path / "performance.md"
    append_record(record, "quantized", results=tmp_path, doc=doc)
    lines = [json.loads(line) for line in (tmp_path / "quantized.jsonl").read_text().splitlines()]
    assert [r["date"] for r in lines] == ["2026-12-04", "2026-12-05", "2026-12-06"]
    assert [r["summary"] for r in load(tmp_path)["quantized"]][0] == "newer"
    assert record["summary"] in doc.read_text()
    with pytest.raises(RecordRefused, match="unknown question"):
        append_record(record, "speed", results=tmp_path, doc=None)


def test_sweeps_that_should_not_be_quoted_are_refused_unless_asked(sweep):
    clean = _result(sweep, dirty=False)
    repeated = copy.deepcopy(clean)
    repeated["sweep"]["prompt_repeats"] = "across rounds"
    with pytest.raises(RecordRefused, match="--allow-repeats"):
        record_from_sweep(repeated)
    assert "PROMPTS REPEATED (across rounds)" in record_from_sweep(repeated, allow_repeats=True)["summary"]
    dirty = _result(sweep, dirty=True, commit="abc1234")
    with pytest.raises(RecordRefused, match="uncommitted changes to dspark/ on top of abc1234"):
        record_from_sweep(dirty)
    assert "uncommitted changes on top of abc1234" in record_from_sweep(dirty, allow_dirty=True)["summary"]
    failed = copy.deepcopy(clean)
    failed["configs"][1]["status"] = "failed"
    with pytest.raises(RecordRefused, match=r"failed in this sweep \(b\)"):
        record_from_sweep(failed)
    old = copy.deepcopy(clean)
    del old["sweep"]["provenance"]
    with pytest.raises(RecordRefused, match="which commit and CPU"):
        record_from_sweep(old)
    with pytest.raises(RecordRefused, match="not a sweep.json"):
        record_from_sweep({"points": []})
    # sweeps of two commits merged have no one provenance
    other = _result(sweep, dirty=False, commit="def5678")
    for c in other["configs"]:
        c["name"] += "2"
    for p in other["points"]:
        p["config"] += "2"
    assert "provenance" in merge_results([clean, copy.deepcopy(clean)], drop=[], replace_repeated=True)["sweep"]
    assert "provenance" not in merge_results([clean, other])["sweep"]


def test_cli_prints_the_record_and_refuses_in_one_line(sweep, tmp_path, capsys):
    (tmp_path / "sweep.json").write_text(json.dumps(_result(sweep, dirty=False)))
    assert main(["bench", "record", str(tmp_path), "--question", "quantized", "--note", "n", "--dry-run"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["summary"].endswith("; n") and printed["results"]["kind"] == "served sweep"
    (tmp_path / "sweep.json").write_text(json.dumps(_result(sweep, dirty=True)))
    assert main(["bench", "record", str(tmp_path), "--question", "quantized", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--allow-dirty" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(["bench", "record", str(tmp_path / "missing"), "--question", "quantized"]) == 2
    assert "cannot read sweep results" in capsys.readouterr().err
