"""`dspark serve` as a command (its default speculation, a clean shutdown), and the
server's pieces that need no live server (held-back stop text, the Prometheus format,
the log line's deltas). The live API's tests are tests/test_serve.py."""

from __future__ import annotations

import httpx
import pytest
from test_serve import sse_events, wait_until

from dspark.engine.sequence import SpecStats
from dspark.runtime.tokenizer import IncrementalDetokenizer
from dspark.serve.metrics import LogWindow, stats_delta
from dspark.serve.prometheus import Counter, Histogram, render


# --- the command ----------------------------------------------------------------------------------------
def test_default_speculation_falls_back_to_prompt_lookup_without_a_shipped_drafter(tmp_path, monkeypatch, caplog):
    from types import SimpleNamespace

    from dspark.engine.config import resolve_speculative

    monkeypatch.setattr("dspark.engine.config.SHIPPED_DIR", tmp_path)
    target = SimpleNamespace(name="default")
    with caplog.at_level("WARNING", logger="dspark.serve"):
        spec = resolve_speculative("default", target)
    # no drafter: prompt lookup alone, its lengths priced by the scheduler, governed from two requests
    assert spec.method == "ngram" and spec.policy == "dspark-async" and spec.plain_fallback == 2 and not spec.lookup
    assert "prompt lookup alone" in caplog.text and "--speculative-config none" in caplog.text
    (tmp_path / "dspark").mkdir()
    (tmp_path / "dspark" / "config.json").write_text("{}")
    spec = resolve_speculative("default", target)
    assert spec.method == "dspark" and spec.policy == "dspark-async" and spec.lookup
    assert resolve_speculative(None, target) is None


def test_speculative_config_names_the_default() -> None:
    """`--speculative-config default` is the server's default by name, how the load
    generator, which knows no engine config, asks for it."""
    from dspark.engine.config import SpeculativeConfig, parse_speculative_arg

    assert parse_speculative_arg(None) == parse_speculative_arg(" Default ") == "default"
    assert parse_speculative_arg("none") is None
    assert isinstance(parse_speculative_arg('{"method": "ngram"}'), SpeculativeConfig)


def test_serve_command_shuts_down_gracefully_on_sigterm():
    import os
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dspark.cli.main", "serve", "--port", str(port), "--dtype", "fp32",
         "--max-model-len", "128", "--max-num-seqs", "2", "--speculative-config", "none", "--threads", "1",
         "--log-interval", "0.5", "--served-model-name", "tiny", "smol"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={k: v for k, v in os.environ.items() if k != "DSPARK_API_KEY"},
    )
    try:
        seen = []  # /health's body while the server starts

        def up() -> bool:
            try:
                r = httpx.get(url + "/health", timeout=2)
            except httpx.TransportError:
                return proc.poll() is not None
            seen.append(r.json()["status"])
            return r.status_code == 200
        assert wait_until(up, timeout=150) and proc.poll() is None, proc.communicate()[0]
        # it listened before the model was loaded: the start-up phases were visible
        assert seen[-1] == "ok" and {"loading", "profiling"} & set(seen), seen
        assert [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]] == ["tiny", "smol"]
        body = {"model": "smol", "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0,
                "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            events = sse_events(r)
            next(events)
            proc.send_signal(signal.SIGTERM)  # in flight: the request still completes
            rest = list(events)
        assert rest[-1] == "[DONE]" and rest[-2]["choices"][0]["finish_reason"] == "length"
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (0, -signal.SIGTERM), out
    assert "engine loop stopped" in out and "generation throughput" in out
    # the engine owns the main thread (torch's CPU thread pool is slow from any other)
    assert "engine loop started on thread MainThread" in out


# --- pieces without a server ------------------------------------------------------------------------
def test_output_text_holds_back_a_possible_stop_string(default_target_fp32):
    tok = default_target_fp32.tokenizer
    ids = tok.encode(" Paris is the capital. Rome is")
    text = IncrementalDetokenizer(tok, ["capital."])
    shown = "".join(text.push([t], finished=False) for t in ids)
    assert shown == " Paris is the " and text.hit_stop and text.text == " Paris is the "
    plain = IncrementalDetokenizer(tok, [])
    assert "".join(plain.push([t], finished=i == len(ids) - 1) for i, t in enumerate(ids)) == tok.decode(ids)


def test_prometheus_exposition_format():
    c = Counter("x:requests_total", "Requests.", ("reason",), {"model_name": 'a"b'})
    c.inc(2, reason="stop")
    h = Histogram("x:latency_seconds", "Latency.", [0.1, 1.0])
    h.observe(0.05)
    h.observe(0.5, count=2)
    h.observe(5)
    lines = render([c, h]).splitlines()
    assert lines[:3] == ["# HELP x:requests_total Requests.", "# TYPE x:requests_total counter",
                         'x:requests_total{model_name="a\\"b",reason="stop"} 2']
    assert 'x:latency_seconds_bucket{le="0.1"} 1' in lines
    assert 'x:latency_seconds_bucket{le="1"} 3' in lines
    assert 'x:latency_seconds_bucket{le="+Inf"} 4' in lines
    assert "x:latency_seconds_count 4" in lines and "x:latency_seconds_sum 6.05" in lines
    with pytest.raises(ValueError):
        c.inc(-1, reason="stop")


def test_stats_delta_and_log_line():
    before, now = SpecStats(), SpecStats()
    before.record(3, 1)
    now.merge(before)
    now.record(4, 4)
    d = stats_delta(now, before)
    assert (d.rounds, d.draft_tokens, d.accepted_tokens) == (1, 4, 4)
    assert d.drafted_per_position == [1, 1, 1, 1] and d.accepted_per_position == [1, 1, 1, 1]
    w = LogWindow()
    assert w.line(running=0, waiting=0) is None  # idle: no line
    w.add(generation_tokens=10)
    w.add_spec(d)
    line = w.line(running=1, waiting=2)
    assert "running 1, waiting 2" in line and "mean acceptance length 5.00" in line
    assert "per-position acceptance [1.000, 1.000, 1.000, 1.000]" in line
