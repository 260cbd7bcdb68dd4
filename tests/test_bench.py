"""`dspark bench serve`: the metrics parser, the latency math, the streaming client,
and a run against a live in-process server (the real default model with n-gram
speculation, a few short greedy requests)."""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
from collections import Counter

import httpx
import numpy as np
import pytest

from dspark.bench.client import RequestResult, request_body, stream_request
from dspark.bench.dataset import DatasetError, jsonl_prompts, load_bench_prompts, sample_prompts
from dspark.bench.prometheus import acceptance_between, parse_prometheus, read_spec_counters
from dspark.bench.runner import BenchError, LoadConfig, arrival_offsets, normalize_base_url
from dspark.bench.stats import RequestTiming, latency_figures, meets_slo, parse_goodput, percentile, summarize
from dspark.cli.main import main

# --- /metrics parsing -------------------------------------------------------------------
DSPARK_METRICS = """\
# HELP dspark:generation_tokens_total Tokens generated (emitted to requests).
# TYPE dspark:generation_tokens_total counter
dspark:generation_tokens_total{model_name="SmolLM2-135M-Instruct"} 512
# HELP dspark:spec_decode_num_drafts_total Verification rounds that drafted at least one token.
# TYPE dspark:spec_decode_num_drafts_total counter
dspark:spec_decode_num_drafts_total{model_name="SmolLM2-135M-Instruct"} 100
# TYPE dspark:spec_decode_num_draft_tokens_total counter
dspark:spec_decode_num_draft_tokens_total{model_name="SmolLM2-135M-Instruct"} 700
# TYPE dspark:spec_decode_num_accepted_tokens_total counter
dspark:spec_decode_num_accepted_tokens_total{model_name="SmolLM2-135M-Instruct"} 250
# TYPE dspark:spec_decode_num_accepted_tokens_per_pos_total counter
dspark:spec_decode_num_accepted_tokens_per_pos_total{model_name="SmolLM2-135M-Instruct",position="0"} 90
dspark:spec_decode_num_accepted_tokens_per_pos_total{model_name="SmolLM2-135M-Instruct",position="1"} 70
dspark:spec_decode_num_accepted_tokens_per_pos_total{model_name="SmolLM2-135M-Instruct",position="2"} 50
dspark:spec_decode_num_accepted_tokens_per_pos_total{model_name="SmolLM2-135M-Instruct",position="3"} 40
# TYPE dspark:time_to_first_token_seconds histogram
dspark:time_to_first_token_seconds_bucket{model_name="SmolLM2-135M-Instruct",le="+Inf"} 8
"""

# prometheus_client style: float values, `_created` samples, one series per engine.
VLLM_METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="Qwen/Qwen3-8B"} 120.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="Qwen/Qwen3-8B"} 80.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="Qwen/Qwen3-8B"} 1.7e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 360.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="Qwen/Qwen3-8B"} 240.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 210.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="Qwen/Qwen3-8B"} 90.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="Qwen/Qwen3-8B",position="0"} 100.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="Qwen/Qwen3-8B",position="1"} 70.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="Qwen/Qwen3-8B",position="2"} 40.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="Qwen/Qwen3-8B",position="0"} 50.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="Qwen/Qwen3-8B",position="1"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="Qwen/Qwen3-8B",position="2"} 10.0
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 0.0
"""


def test_parse_prometheus_labels_values_and_comments():
    text = ('# HELP x help\nm{a="1",b="with \\"quote\\", comma"} 2.5\nn 7 1700000000000\n'
            'h_bucket{le="+Inf"} +Inf\nbroken line\n\n')
    s = parse_prometheus(text)
    assert [(x.name, x.labels, x.value) for x in s[:2]] == [
        ("m", {"a": "1", "b": 'with "quote", comma'}, 2.5), ("n", {}, 7.0)]
    assert s[2].value == math.inf and len(s) == 3


def _zeroed(text: str) -> str:
    """The same series, every value 0: a reading before any traffic."""
    return re.sub(r"^([^#].*[} ]) \S+$", r"\1 0", text, flags=re.MULTILINE)


def test_spec_counters_with_dspark_names():
    c = read_spec_counters(DSPARK_METRICS)
    assert (c.prefix, c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == ("dspark", 100, 700, 250)
    assert c.accepted_per_position == {0: 90, 1: 70, 2: 50, 3: 40}
    acc = acceptance_between(read_spec_counters(_zeroed(DSPARK_METRICS)), c)
    assert acc["metrics_prefix"] == "dspark"
    assert acc["acceptance_length"] == pytest.approx(1 + 250 / 100)
    assert acc["acceptance_rate"] == pytest.approx(250 / 700)
    assert acc["mean_draft_length"] == pytest.approx(7.0)
    assert acc["per_position_acceptance"] == pytest.approx([0.9, 0.7, 0.5, 0.4])


def test_spec_counters_with_vllm_names_sum_engines():
    c = read_spec_counters(VLLM_METRICS, model="Qwen/Qwen3-8B")
    assert (c.prefix, c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == ("vllm", 200, 600, 300)
    assert c.accepted_per_position == {0: 150, 1: 100, 2: 50}
    acc = acceptance_between(read_spec_counters(_zeroed(VLLM_METRICS)), c)
    assert acc["metrics_prefix"] == "vllm"
    assert acc["acceptance_length"] == pytest.approx(2.5)
    assert acc["per_position_acceptance"] == pytest.approx([0.75, 0.5, 0.25])
    # a model_name that matches no series: every series still counts
    assert read_spec_counters(VLLM_METRICS, model="other").num_drafts == 200
    # both prefixes present (a proxy in front of two servers): dspark's are read
    assert read_spec_counters(VLLM_METRICS + DSPARK_METRICS).prefix == "dspark"


def test_acceptance_edge_cases():
    c = read_spec_counters(DSPARK_METRICS)
    assert read_spec_counters("# nothing\nfoo_total 3\n") is None
    assert acceptance_between(None, c) is None
    same = acceptance_between(c, c)
    assert same["num_drafts"] == 0 and same["acceptance_length"] is None  # no speculation in between
    restarted = acceptance_between(c, read_spec_counters(DSPARK_METRICS.replace(" 100\n", " 3\n")))
    assert "restart" in restarted["error"] and restarted["acceptance_length"] is None


def test_parser_reads_our_own_exporter():
    """The parser against what `dspark serve` actually renders."""
    from dspark.engine.sequence import SpecStats
    from dspark.serve.metrics import ServingMetrics

    m = ServingMetrics("some-model")
    m.on_spec(SpecStats(rounds=10, draft_tokens=40, accepted_tokens=15, drafted_per_position=[10, 10, 10, 10],
                        accepted_per_position=[8, 4, 2, 1]))
    c = read_spec_counters(m.render(), model="some-model")
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (10, 40, 15)
    assert c.accepted_per_position == {0: 8, 1: 4, 2: 2, 3: 1}


# --- latency math ---------------------------------------------------------------------------
def test_percentile_and_summary_match_numpy():
    rng = random.Random(0)
    for n in (1, 2, 7, 100):
        xs = [rng.expovariate(1.0) for _ in range(n)]
        for p in (0, 1, 50, 90, 99, 100):
            assert percentile(xs, p) == pytest.approx(np.percentile(xs, p))
        s = summarize(xs, (90, 99.9))
        assert s["mean"] == pytest.approx(np.mean(xs)) and s["median"] == pytest.approx(np.median(xs))
        assert s["std"] == pytest.approx(np.std(xs)) and s["p99.9"] == pytest.approx(np.percentile(xs, 99.9))
    assert summarize([], (99,)) == dict.fromkeys(["mean", "median", "std", "min", "max", "p99"])
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_tpot_itl_and_per_user_definitions():
    # 11 tokens: the first at 0.1 s, then 10 more over 1.0 s, in 4 chunks (speculative: several per chunk)
    t = RequestTiming(ttft=0.1, e2el=1.1, output_tokens=11, itls=[0.3, 0.3, 0.4])
    assert t.tpot == pytest.approx(0.1) and t.user_tps == pytest.approx(10.0)
    one = RequestTiming(ttft=0.2, e2el=0.2, output_tokens=1, itls=[])
    assert one.tpot is None and one.user_tps is None
    f = latency_figures([t, one], duration=2.0, percentiles=(99,))
    assert f["tpot_ms"]["mean"] == pytest.approx(100.0)  # per token, whatever the chunking
    assert f["itl_ms"]["mean"] == pytest.approx(1000 / 3)  # per chunk: the wait between updates
    assert f["ttft_ms"]["median"] == pytest.approx(150.0)
    assert f["per_user_tps"]["median"] == pytest.approx(10.0)
    assert f["goodput"] is None


def test_goodput_counts_requests_within_every_slo():
    timings = [RequestTiming(ttft=0.05 * i, e2el=0.05 * i + 1.0, output_tokens=11, itls=[]) for i in range(10)]
    slo = parse_goodput(["ttft:200", "e2el:1200"])
    assert slo == {"ttft": 200.0, "e2el": 1200.0}
    # ttft <= 200 ms: i <= 4; e2el <= 1200 ms: i <= 4
    f = latency_figures(timings, duration=4.0, slo=slo)
    assert f["goodput"] == {"slo_ms": slo, "good_requests": 5, "request_goodput": 1.25}
    assert not meets_slo(timings[0], {"tpot": 99.0}) and meets_slo(timings[0], {"tpot": 100.5})
    assert meets_slo(RequestTiming(0.1, 0.1, 1, []), {"tpot": 1.0})  # no TPOT: meets a TPOT SLO
    for bad in (["ttft"], ["speed:3"], ["tpot:abc"], ["e2el:-1"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)


def test_arrivals_are_seeded_poisson():
    assert arrival_offsets(5, math.inf, 1.0, 0) == [0.0] * 5
    a = arrival_offsets(4000, 20.0, 1.0, seed=3)
    assert a == arrival_offsets(4000, 20.0, 1.0, seed=3) != arrival_offsets(4000, 20.0, 1.0, seed=4)
    gaps = np.diff(a)
    assert a[0] == 0.0 and gaps.mean() == pytest.approx(1 / 20, rel=0.05)
    assert gaps.std() == pytest.approx(1 / 20, rel=0.1)  # exponential: std = mean


def test_load_config_validation():
    assert normalize_base_url("http://h:1/v1/") == "http://h:1"
    for bad in (dict(base_url="h:1"), dict(endpoint="embeddings"), dict(num_prompts=0), dict(request_rate=0.0),
                dict(max_concurrency=0), dict(temperature=3.0), dict(percentiles=(101.0,))):
        with pytest.raises(BenchError):
            LoadConfig(**{"base_url": "http://h:1", **bad})


# --- prompts and the client ---------------------------------------------------------------
def test_jsonl_prompts_and_conversions(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "Once upon a time"}\n\n'
                    '{"messages": [{"role": "system", "content": "Be brief."}, '
                    '{"role": "user", "content": "Hi"}], "max_tokens": 5}\n')
    a, b = jsonl_prompts(path)
    assert a.chat_messages() == [{"role": "user", "content": "Once upon a time"}]
    assert b.completion_prompt() == "Be brief.\n\nHi" and b.max_tokens == 5
    body = request_body(b, "chat", "m", 64, 0.0, ignore_eos=True, extra_body={"top_p": 0.5})
    assert body["max_tokens"] == 5 and body["ignore_eos"] is True and body["top_p"] == 0.5
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert "ignore_eos" not in request_body(a, "completions", "m", 64, 0.0, ignore_eos=False)
    assert len(sample_prompts([a, b], 5, seed=1)) == 5
    assert sample_prompts([a, b], 5, seed=1) == sample_prompts([a, b], 5, seed=1)
    for text in ('{"messages": []}', '[1]', '{"prompt": "x", "max_tokens": 0}', "not json"):
        path.write_text(text + "\n")
        with pytest.raises(DatasetError, match="p.jsonl:1"):
            jsonl_prompts(path)
    with pytest.raises(DatasetError):
        jsonl_prompts(tmp_path / "missing.jsonl")


def test_mixed_heldout_prompts_take_equal_shares():
    from dspark.data import load_prompts

    domain_of = {p.messages[0]["content"]: p.domain for p in load_prompts("heldout")}
    mixed = load_bench_prompts("mixed", None, 30, seed=0)
    counts = Counter(domain_of[p.chat_messages()[0]["content"]] for p in mixed)
    assert counts == {"math": 10, "code": 10, "chat": 10}
    assert mixed == load_bench_prompts("mixed", None, 30, seed=0) != load_bench_prompts("mixed", None, 30, seed=1)
    assert all(domain_of[p.chat_messages()[0]["content"]] == "code"
               for p in load_bench_prompts("code", None, 5, seed=0))


def _sse(*events: object) -> bytes:
    return b"".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode() for e in events)


def _stream(body: bytes, status: int = 200) -> RequestResult:
    transport = httpx.MockTransport(lambda request: httpx.Response(status, content=body))

    async def go() -> RequestResult:
        async with httpx.AsyncClient(transport=transport) as client:
            return await stream_request(client, "http://x/v1/chat/completions", {}, {})

    return asyncio.run(go())


def test_client_counts_tokens_by_usage_and_itl_by_chunk():
    def chunk(text, finish=None):
        return {"choices": [{"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}]}

    # 7 tokens in 3 text chunks (a speculative server), then the usage event
    body = _sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                chunk("The"), chunk(" cat sat on"), chunk(" the mat"), chunk("", "stop"),
                {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}},
                "[DONE]")
    r = _stream(body)
    assert r.success and r.error is None
    assert (r.output_tokens, r.prompt_tokens, r.text_chunks, len(r.itls)) == (7, 12, 3, 2)
    assert r.tokens_from_usage and 0 <= r.ttft <= r.e2el
    # without usage: one token per text chunk, and the result says so
    r = _stream(_sse(chunk("a"), chunk("b", "length"), "[DONE]"))
    assert r.success and r.output_tokens == 2 and not r.tokens_from_usage


def test_client_failures():
    r = _stream(json.dumps({"error": {"message": "the model 'x' does not exist"}}).encode(), status=400)
    assert not r.success and r.error == "HTTP 400: the model 'x' does not exist"
    r = _stream(_sse({"choices": [{"delta": {"content": "a"}}]}, {"error": {"message": "boom"}}))
    assert not r.success and "boom" in r.error
    r = _stream(_sse({"choices": [{"delta": {"content": "a"}, "finish_reason": None}]}))
    assert not r.success and "ended without" in r.error


# --- against a live server -------------------------------------------------------------
@pytest.fixture(scope="module")
def ngram_server(default_target_fp32):
    from dspark.engine.engine import EngineConfig, LLMEngine
    from dspark.serve import ServeConfig, ServerThread, create_app
    from dspark.engine.config import SpeculativeConfig

    engine = LLMEngine(default_target_fp32, SpeculativeConfig(method="ngram"),
                       EngineConfig(max_num_seqs=4, max_model_len=512))
    app = create_app(engine, ServeConfig(log_interval=0))
    with ServerThread(app) as server:
        yield server


def test_bench_serve_against_live_server(ngram_server, tmp_path):
    metrics = ngram_server.app.state.dspark.metrics
    drafts_before, accepted_before = metrics.num_drafts.value(), metrics.num_accepted_tokens.value()
    out = tmp_path / "result.json"
    rc = main(["bench", "serve", "--base-url", ngram_server.url + "/v1", "--dataset", "math", "--num-prompts", "4",
               "--num-warmups", "1", "--max-concurrency", "2", "--max-tokens", "12", "--ignore-eos",
               "--goodput", "ttft:600000", "tpot:600000", "--json-out", str(out), "--save-detailed",
               "--disable-tqdm"])
    assert rc == 0
    r = json.loads(out.read_text())
    cfg = r["config"]
    assert cfg["model"] == "SmolLM2-135M-Instruct" and cfg["max_concurrency"] == 2 and cfg["ignore_eos"]
    assert "api_key" not in cfg
    assert (r["completed"], r["failed"], r["errors"]) == (4, 0, {})
    assert r["total_output_tokens"] == 4 * 12 and r["output_tokens_from_usage"]
    assert r["total_input_tokens"] > 4 * 20
    assert r["duration_s"] > 0 and r["max_concurrent_requests"] == 2
    assert r["request_throughput"] == pytest.approx(4 / r["duration_s"])
    assert r["output_throughput"] == pytest.approx(48 / r["duration_s"])
    assert r["total_token_throughput"] == pytest.approx((48 + r["total_input_tokens"]) / r["duration_s"])
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "per_user_tps"):
        s = r[key]
        assert 0 < s["min"] <= s["median"] <= s["p99"] <= s["max"] and s["mean"] > 0, key
    assert r["ttft_ms"]["max"] < r["e2el_ms"]["max"]
    for q in r["requests"]:  # per-user tok/s is 1/TPOT of each request
        assert q["success"] and q["output_tokens"] == 12
    tpots = [(q["e2el_s"] - q["ttft_s"]) / 11 for q in r["requests"]]
    assert r["per_user_tps"]["mean"] == pytest.approx(np.mean([1 / t for t in tpots]))
    assert r["tpot_ms"]["mean"] == pytest.approx(1e3 * np.mean(tpots))
    # ITL has one sample per text chunk after the first; a chunk holds one token or more
    assert r["mean_tokens_per_chunk"] >= 1
    assert sum(len(q["itls_s"]) for q in r["requests"]) == pytest.approx(48 / r["mean_tokens_per_chunk"] - 4)
    assert r["goodput"]["good_requests"] == 4
    # acceptance from /metrics equals what the server counted (the warm-up excluded)
    spec = r["spec_decode"]
    assert spec["metrics_prefix"] == "dspark" and spec["num_drafts"] > 0
    assert spec["num_drafts"] <= metrics.num_drafts.value() - drafts_before
    assert spec["num_accepted_tokens"] <= metrics.num_accepted_tokens.value() - accepted_before
    assert spec["acceptance_length"] == pytest.approx(1 + spec["num_accepted_tokens"] / spec["num_drafts"])
    assert spec["acceptance_length"] >= 1
    per_pos = spec["per_position_acceptance"]
    assert all(1 >= a >= b >= 0 for a, b in zip(per_pos, per_pos[1:]))  # a prefix is accepted, never a gap
    assert sum(per_pos) * spec["num_drafts"] == pytest.approx(spec["num_accepted_tokens"])


def test_bench_serve_completions_from_jsonl_open_loop(ngram_server, tmp_path, capsys):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "1, 2, 3, 1, 2, 3, 1, 2, 3,"}\n'
                    '{"messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 4}\n')
    out = tmp_path / "r.json"
    rc = main(["bench", "serve", "--base-url", ngram_server.url, "--endpoint", "completions", "--dataset-path",
               str(data), "--num-prompts", "3", "--request-rate", "20", "--seed", "1", "--max-tokens", "6",
               "--ignore-eos", "--json-out", str(out), "--disable-tqdm"])
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["completed"] == 3 and r["config"]["request_rate"] == 20.0 and r["config"]["endpoint"] == "completions"
    assert r["total_output_tokens"] in (6 + 6 + 4, 6 + 4 + 4)  # the 4-token prompt once or twice
    table = capsys.readouterr().out
    for label in ("Successful requests", "Output token throughput", "Median TTFT (ms)", "P99 ITL (ms)",
                  "Mean TPOT (ms)", "Median per-user tok/s", "Acceptance length"):
        assert label in table


def test_bench_serve_unreachable_server_is_a_clear_error(capsys):
    from dspark.bench.server_process import free_port

    rc = main(["bench", "serve", "--base-url", f"http://127.0.0.1:{free_port()}", "--num-prompts", "1",
               "--disable-tqdm"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "cannot reach the server" in err and "--base-url" in err


NO_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "tokenizers", "safetensors"):
            raise ImportError(f"{name} is blocked: dspark bench must run without it")
sys.meta_path.insert(0, Block())
from dspark.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_bench_runs_without_torch(tmp_path):
    """The HTTP-only benchmark client needs neither torch nor transformers: it runs on
    a machine that only sends load (errors.py is a leaf; nothing upstream imports torch)."""
    import subprocess
    import sys

    from dspark.bench.server_process import free_port

    r = subprocess.run([sys.executable, "-c", NO_TORCH, "bench", "serve", "--base-url",
                        f"http://127.0.0.1:{free_port()}", "--num-prompts", "2", "--disable-tqdm"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "cannot reach the server" in r.stderr, r.stderr
    assert "blocked" not in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-c", NO_TORCH, "bench", "--help"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "sweep" in r.stdout, r.stderr


def test_no_point_of_a_sweep_meets_another_points_prompts():
    """A server that keeps recent prompts (a prefix cache, llama.cpp's slots) must not
    meet a prompt again later in the run: every (round, concurrency) point takes its own
    slice while the pool holds enough, rounds share their concurrencies' prompts when it
    holds less, and everything is shared when even that is too much."""
    from dspark.bench.sweep import point_pools

    needs = {1: 17, 16: 32}
    pools, repeats = point_pools(list(range(200)), 3, needs)
    assert repeats == "none" and len(pools) == 6
    seen = [x for share in pools.values() for x in share]
    assert len(seen) == len(set(seen)) == 3 * 49
    assert all(len(pools[r, c]) == needs[c] for r in range(3) for c in needs)
    pools, repeats = point_pools(list(range(100)), 3, needs)  # 33 a round: >= 32, < 49
    assert repeats == "across concurrencies"
    assert pools[0, 1] == pools[0, 16] and not set(pools[0, 1]) & set(pools[1, 1])
    pools, repeats = point_pools(list(range(60)), 3, needs)
    assert repeats == "across rounds" and pools[2, 16] == list(range(60))
