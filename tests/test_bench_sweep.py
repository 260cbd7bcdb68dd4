"""`dspark bench sweep`: configuration parsing, tiers and the frontier on synthetic
points, server subprocesses that are always stopped, and a short real sweep (two
`dspark serve` subprocesses on the default model, two concurrencies)."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from dspark.bench.runner import BenchError
from dspark.bench.server_process import ServerProcess, free_port
from dspark.bench.rounds import aggregate_runs
from dspark.bench.sweep import mark_pareto, parse_server_config, tier_table
from dspark.cli.main import main


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie no one has reaped yet is gone too
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if gone(pid):
            return True
        time.sleep(0.1)
    return gone(pid)


# --- configurations, tiers, frontier -----------------------------------------------------
def test_parse_server_configs():
    assert parse_server_config("none").speculative is None
    assert parse_server_config("ngram").speculative == {"method": "ngram"}
    assert parse_server_config("dspark-adaptive").speculative == {"method": "dspark",
                                                                  "enable_adaptive_verification": True}
    c = parse_server_config('mine={"method": "dspark", "num_speculative_tokens": 15}')
    assert (c.name, c.kind, c.speculative["num_speculative_tokens"]) == ("mine", "dspark", 15)
    assert parse_server_config("off=none").speculative is None
    # the server's own default by name: the load generator spells out no engine config
    assert parse_server_config("default").speculative == "default"
    assert parse_server_config("mine=default").speculative == "default"
    c = parse_server_config("vllm=http://10.0.0.2:8000/v1")
    assert (c.kind, c.url) == ("url", "http://10.0.0.2:8000/v1")
    c = parse_server_config("sg=python -m sglang.launch_server --port {port}")
    assert (c.kind, c.command) == ("command", "python -m sglang.launch_server --port {port}")
    for bad, match in (("medusa", "unknown configuration"), ("x=serve --port 8000", "{port}"),
                       ("x={bad json", "not valid JSON"), ("a b=none", "name"), ("x=[1]", "{port}")):
        with pytest.raises(BenchError, match=match):
            parse_server_config(bad)


def _run(tput: float, user: float, acc: float | None = None) -> dict:
    return {"config": {"num_prompts": 8}, "request_throughput": tput / 100, "output_throughput": tput,
            "total_token_throughput": 2 * tput, "per_user_tps": {"median": user, "mean": user, "p99": user},
            "ttft_ms": {"median": 10.0}, "tpot_ms": {"median": 1e3 / user}, "itl_ms": {"median": 1e3 / user},
            "e2el_ms": {"median": 500.0}, "mean_tokens_per_chunk": 1.0, "failed": 0,
            "spec_decode": None if acc is None else {"acceptance_length": acc}}


def test_rounds_give_median_and_spread():
    p = aggregate_runs("a", 4, [_run(100, 30, 2.0), _run(120, 20, 3.0), _run(90, 25, 2.5)])
    assert (p["output_throughput"], p["per_user_tps"], p["acceptance_length"]) == (100, 25, 2.5)
    assert p["spread"]["output_throughput"] == [90, 120] and p["spread"]["per_user_tps"] == [20, 30]
    assert p["rounds"] == 3 and len(p["runs"]) == 3
    single = aggregate_runs("a", 1, [_run(50, 40)])
    assert single["spread"] == {} and single["acceptance_length"] is None


def test_tiers_and_pareto():
    points = [aggregate_runs(name, c, [_run(t, u)]) for name, c, t, u in (
        ("none", 1, 40, 40), ("none", 4, 120, 30), ("none", 16, 200, 12),
        ("dspark", 1, 90, 90), ("dspark", 4, 250, 62), ("dspark", 16, 400, 25))]
    table = tier_table(points, [100, 10, 40], ["none", "dspark", "failed-one"])
    assert [row["tier"] for row in table] == [10, 40, 100]
    assert table[0]["best"]["none"] == {"output_throughput": 200, "concurrency": 16, "per_user_tps": 12}
    assert table[0]["best"]["dspark"]["output_throughput"] == 400
    assert table[1]["best"]["none"] == {"output_throughput": 40, "concurrency": 1, "per_user_tps": 40}
    assert table[1]["best"]["dspark"]["concurrency"] == 4
    assert table[2]["best"] == {"none": None, "dspark": None, "failed-one": None}
    mark_pareto(points)
    assert [p["pareto"] for p in points] == [False, False, False, True, True, True]


def test_outputs_with_rounds_and_a_failed_configuration(tmp_path):
    from dspark.bench.sweep_report import write_outputs

    points = [aggregate_runs("dspark", c, [_run(t, u, 3.0), _run(t * 1.1, u * 0.9, 3.2)])
              for c, t, u in ((1, 90, 90), (4, 250, 62))]
    mark_pareto(points)
    result = {"sweep": {"concurrencies": [1, 4], "tiers": [50.0, 80.0, 500.0], "rounds": 2, "servers": "together",
                        "num_prompts": 8,
                        "num_warmups": 1, "server_args": [],
                        "load": {"dataset": "mixed", "dataset_path": None, "endpoint": "chat", "max_tokens": 64,
                                 "temperature": 0.0, "ignore_eos": True}},
              "configs": [{"name": "dspark", "kind": "dspark", "speculative_config": {"method": "dspark"},
                           "status": "ok", "error": None, "startup_s": 3.0},
                          {"name": "sg", "kind": "command", "command": "a | b {port}", "status": "failed",
                           "error": "configuration 'sg' did not start", "startup_s": None}],
              "points": points, "tiers": tier_table(points, [50.0, 80.0, 500.0], ["dspark", "sg"])}
    write_outputs(result, tmp_path)
    md = (tmp_path / "sweep.md").read_text()
    assert "2 round(s), all servers up together" in md and "median [min-max] over rounds" in md
    assert "| dspark | 4 | 2.62 [2.50-2.75] | 262.5 [250.0-275.0] |" in md  # median [min-max]
    assert "| 3.10 [3.00-3.20] | 1.00 | 0 | yes |" in md  # acceptance length with its spread
    assert "| 50 | 262.5 (c=4) | failed |" in md and "| 500 | - | failed |" in md
    assert "dspark cannot reach 500 tok/s per user (its fastest point: 85.5" in md
    assert "`a \\| b {port}`" in md and "configuration 'sg' did not start" in md
    assert json.loads((tmp_path / "sweep.json").read_text())["points"][0]["spread"]["output_throughput"] == pytest.approx([90, 99])
    assert (tmp_path / "pareto.png").stat().st_size > 0 and (tmp_path / "throughput_vs_concurrency.png").exists()


def _sweep(points: list[dict], names: list[str], max_tokens: int = 64) -> dict:
    """A sweep.json as written before rounds (repeats, one configuration after another)."""
    return {"sweep": {"concurrencies": [1, 4], "tiers": [50.0], "repeats": 2, "num_prompts": 8, "num_warmups": 1,
                      "server_args": [], "load": {"dataset": "mixed", "dataset_path": None, "endpoint": "chat",
                                                  "max_tokens": max_tokens, "temperature": 0.0,
                                                  "ignore_eos": False, "seed": 0}},
            "configs": [{"name": n, "kind": "url", "url": "http://x", "status": "ok", "error": None,
                         "startup_s": None} for n in names],
            "points": points, "tiers": []}


def test_merged_report_ratios_and_dominance(tmp_path, capsys):
    from dspark.bench.sweep_report import dominance

    def pts(name, rows):
        return [aggregate_runs(name, c, [_run(t, u), _run(t * hi, u * hi)]) for c, t, u, hi in rows]

    # "fast" beats "none" at both concurrencies; "close" misses none's c=4 point by less than its own spread
    first = _sweep(pts("none", [(1, 40, 40, 1.0), (4, 120, 30, 1.0)]), ["none"])
    second = _sweep(pts("fast", [(1, 60, 60, 1.0), (4, 180, 45, 1.0)]) +
                    pts("close", [(1, 40, 40, 1.0), (4, 110, 28, 1.2)]), ["fast", "close"])
    (tmp_path / "a.json").write_text(json.dumps(first))
    (tmp_path / "b.json").write_text(json.dumps(second))
    assert main(["bench", "report", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                 "--out", str(tmp_path / "r"), "--tiers", "35,55"]) == 0
    md = (tmp_path / "r" / "sweep.md").read_text()
    assert "2 repeat(s) per point, the configurations one after another (not interleaved" in md
    # against none, per concurrency: ratios of medians, marked, since the sweeps were separate
    assert "| fast | 1.50* / 1.50* | 1.50* / 1.50* |" in md and "which the machine's drift" in md
    merged = json.loads((tmp_path / "r" / "sweep.json").read_text())
    assert [c["name"] for c in merged["configs"]] == ["none", "fast", "close"]
    assert dominance(merged, "fast", "none") == {"strict": [], "within_noise": []}
    # close's median at c=4 is (121, 30.8) vs none's (120, 30): covered; none does not cover close's c=4
    assert dominance(merged, "none", "close") == {"strict": [4], "within_noise": [4]}
    assert dominance(merged, "close", "fast")["strict"] == [1, 4]
    assert "| fast | none, close | - | - |" in md
    assert merged["tiers"][1]["best"] == {"none": None, "fast": {"output_throughput": 60.0, "concurrency": 1,
                                                                 "per_user_tps": 60.0}, "close": None}
    # a configuration measured again replaces the first measurement with --replace; --drop leaves one out
    (tmp_path / "a2.json").write_text(json.dumps(_sweep(pts("none", [(1, 50, 50, 1.0), (4, 150, 40, 1.0)]), ["none"])))
    assert main(["bench", "report", str(tmp_path / "a.json"), str(tmp_path / "b.json"), str(tmp_path / "a2.json"),
                 "--replace", "--drop", "close", "--out", str(tmp_path / "d")]) == 0
    again = json.loads((tmp_path / "d" / "sweep.json").read_text())
    assert [c["name"] for c in again["configs"]] == ["none", "fast"]
    assert sorted(p["output_throughput"] for p in again["points"] if p["config"] == "none") == [50, 150]
    assert "| fast | 1.20* / 1.20* | 1.20* / 1.12* |" in (tmp_path / "d" / "sweep.md").read_text()
    # sweeps of another load, or with a name twice, are refused in one line
    (tmp_path / "c.json").write_text(json.dumps(_sweep([], ["other"], max_tokens=128)))
    assert main(["bench", "report", str(tmp_path / "a.json"), str(tmp_path / "c.json"), "--out", str(tmp_path)]) == 2
    assert "differ in max_tokens" in capsys.readouterr().err
    assert main(["bench", "report", str(tmp_path / "a.json"), str(tmp_path / "a.json"), "--out", str(tmp_path)]) == 2
    assert "appears in more than one sweep" in capsys.readouterr().err


# --- server processes ----------------------------------------------------------------------
HEALTH_SERVER = """
import http.server, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)   # a server that will not stop politely
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_server_process_escalates_to_sigkill(tmp_path):
    script = tmp_path / "health.py"
    script.write_text(HEALTH_SERVER)
    port = free_port()
    server = ServerProcess([sys.executable, str(script), str(port)], f"http://127.0.0.1:{port}",
                           tmp_path / "log.txt", startup_timeout=30, grace_period=1.0)
    with server:
        assert server.running and server.startup_s is not None
        pid = server.proc.pid
    assert not server.running and wait_gone(pid)
    assert server.proc.returncode == -9  # SIGTERM was ignored


def test_failed_starts_are_clear_errors_and_leave_no_process(tmp_path, capsys):
    child = tmp_path / "child.pid"
    out = tmp_path / "sweep"
    rc = main(["bench", "sweep", "--out", str(out), "--concurrency", "1", "--disable-tqdm",
               "--server-timeout", "3", "--grace-period", "1", "--configs",
               f"hang=sh -c 'sleep 300 & echo $! > {child}; wait' hang {{port}}",
               "crash=sh -c 'echo cannot bind port $1 >&2; exit 3' crash {port}"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "2 of 2 configurations failed (hang, crash)" in err
    assert "configuration 'hang' did not start: the server was not healthy" in err and "--server-timeout" in err
    assert "configuration 'crash' did not start: the server exited with status 3" in err
    assert "cannot bind port" in err  # the server's own words, from its log
    result = json.loads((out / "sweep.json").read_text())
    assert [(c["name"], c["status"]) for c in result["configs"]] == [("hang", "failed"), ("crash", "failed")]
    assert result["points"] == []
    assert "## Failed configurations" in (out / "sweep.md").read_text()
    for pid in (int(child.read_text()), *(c["pid"] for c in result["configs"])):
        assert wait_gone(pid), f"process {pid} outlived the sweep"


def test_failed_dspark_serve_start(tmp_path, capsys):
    out = tmp_path / "sweep"
    rc = main(["bench", "sweep", "--out", str(out), "--configs", "none", "--concurrency", "1",
               "--disable-tqdm", "--server-timeout", "120", "--server-args", f"--model {tmp_path / 'no-model'}"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "configuration 'none' did not start" in err and "is not a directory" in err
    entry = json.loads((out / "sweep.json").read_text())["configs"][0]
    assert entry["status"] == "failed" and wait_gone(entry["pid"])


# --- a short real sweep ---------------------------------------------------------------------
@pytest.mark.slow
def test_short_sweep_none_and_ngram(tmp_path, capsys):
    out = tmp_path / "sweep"
    rc = main(["bench", "sweep", "--out", str(out), "--configs", "none", "ngram", "--concurrency", "1,2",
               "--rounds", "2", "--num-prompts", "2", "--num-warmups", "0", "--dataset", "math", "--max-tokens", "16",
               "--ignore-eos", "--tiers", "0.5,1000", "--disable-tqdm", "--grace-period", "10",
               "--server-args", "--max-model-len 512 --dtype fp32 --max-num-seqs 4 --log-interval 0"])
    assert rc == 0
    for name in ("sweep.json", "sweep.md", "pareto.png", "throughput_vs_concurrency.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = json.loads((out / "sweep.json").read_text())
    assert result["sweep"]["concurrencies"] == [1, 2] and result["sweep"]["server_args"][0] == "--max-model-len"
    assert [(c["name"], c["status"]) for c in result["configs"]] == [("none", "ok"), ("ngram", "ok")]
    points = result["points"]
    assert [(p["config"], p["concurrency"]) for p in points] == [("none", 1), ("none", 2), ("ngram", 1),
                                                                   ("ngram", 2)]
    assert result["order"] == [[0, "none", 1], [0, "ngram", 1], [0, "none", 2], [0, "ngram", 2],
                               [1, "ngram", 1], [1, "none", 1], [1, "ngram", 2], [1, "none", 2]]
    for p in points:
        assert p["rounds"] == 2
        run = p["runs"][0]
        assert run["completed"] == 2 and run["failed"] == 0 and run["total_output_tokens"] == 32
        assert run["config"]["max_concurrency"] == p["concurrency"]
        assert p["output_throughput"] > 0 and p["per_user_tps"] > 0 and p["tpot_ms"] > 0
    assert all(p["acceptance_length"] is None for p in points[:2])  # no speculation, no drafts
    assert all(p["acceptance_length"] >= 1 for p in points[2:])
    assert any(p["pareto"] for p in points)
    tiers = {row["tier"]: row["best"] for row in result["tiers"]}
    assert tiers[0.5]["none"] is not None and tiers[0.5]["ngram"] is not None
    assert tiers[1000] == {"none": None, "ngram": None}
    md = (out / "sweep.md").read_text()
    assert "| ngram | 2 |" in md and "## SLA tiers" in md and "none cannot reach 1000" in md
    assert "![pareto.png](pareto.png)" in md and "## Against none" in md
    assert all(row["output_throughput"]["paired"] for row in result["ratios"])
    assert md in capsys.readouterr().out
    for c in result["configs"]:
        assert wait_gone(c["pid"]), f"server {c['name']} outlived the sweep"
