"""`dspark serve` while it starts: /health and /metrics answer before the engine
exists, and a request sent then waits for the engine (up to --ready-wait) or gets an
OpenAI-style 503. A tiny fp32 model, built while the server listens."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from dspark.bench.fuzz import write_tiny_model
from dspark.engine.engine import EngineConfig
from dspark.runtime.default_model import default_model_dir
from dspark.serve import ServeConfig, ServerThread, create_app
from test_serve import assert_error


def test_health_and_metrics_answer_while_the_engine_is_built(tmp_path):
    write_tiny_model(tmp_path / "tiny", default_model_dir())
    config = ServeConfig(model=str(tmp_path / "tiny"), dtype="fp32", speculative=None, log_interval=0,
                         engine=EngineConfig(max_num_seqs=2, max_model_len=64), ready_wait=0)
    app = create_app(config, build=False)
    with ServerThread(app) as srv:
        r = httpx.get(srv.url + "/health", timeout=10)
        assert r.status_code == 503 and r.json()["status"] == "starting" and r.headers["retry-after"]
        assert "dspark:num_requests_running" in httpx.get(srv.url + "/metrics", timeout=10).text
        err = assert_error(httpx.post(srv.url + "/v1/completions", json={"prompt": "hi"}, timeout=10), 503)
        assert err["code"] == "starting" and "starting" in err["message"]
        assert_error(httpx.get(srv.url + "/v1/models", timeout=10), 503)
        phases = []
        app.state.dspark.set_phase = lambda phase, real=app.state.dspark.set_phase: (phases.append(
            httpx.get(srv.url + "/health", timeout=10).json()["status"]), real(phase), phases.append(
            httpx.get(srv.url + "/health", timeout=10).json()["status"]))
        app.state.dspark.build()
        app.state.dspark.async_engine.start()  # the lifespan started before there was an engine
        assert phases == ["starting", "loading", "loading", "profiling"]
        assert httpx.get(srv.url + "/health", timeout=10).json() == {"status": "ok"}
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3, "temperature": 0},
                       timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        assert [m["id"] for m in httpx.get(srv.url + "/v1/models", timeout=10).json()["data"]] == ["tiny"]


def test_a_request_sent_during_start_up_waits_for_the_engine(tmp_path):
    """A client started beside the server: its request waits (up to --ready-wait) and is
    answered once the engine is built, instead of a 503 it would have to retry; one that
    outwaits --ready-wait, or arrives after a failed build, gets the 503."""
    write_tiny_model(tmp_path / "tiny", default_model_dir())
    config = ServeConfig(model=str(tmp_path / "tiny"), dtype="fp32", speculative=None, log_interval=0,
                         engine=EngineConfig(max_num_seqs=2, max_model_len=64), ready_wait=60)
    app = create_app(config, build=False)
    state = app.state.dspark
    with ServerThread(app) as srv:
        got = {}

        def call():
            got["r"] = httpx.post(srv.url + "/v1/completions", timeout=90,
                                  json={"prompt": "hi", "max_tokens": 3, "temperature": 0})

        caller = threading.Thread(target=call)
        caller.start()
        time.sleep(1.0)
        assert "r" not in got  # still waiting: nothing is built yet
        assert httpx.get(srv.url + "/health", timeout=10).json()["status"] == "starting"
        state.build()
        state.async_engine.start()
        caller.join(60)
        assert got["r"].status_code == 200 and got["r"].json()["usage"]["completion_tokens"] == 3

    short = create_app(ServeConfig(model=str(tmp_path / "tiny"), dtype="fp32", speculative=None, log_interval=0,
                                   ready_wait=0.5), build=False)
    with ServerThread(short) as srv:
        t = time.monotonic()
        err = assert_error(httpx.post(srv.url + "/v1/completions", json={"prompt": "hi"}, timeout=10), 503)
        assert 0.4 <= time.monotonic() - t < 5 and err["code"] == "starting"
        short.state.dspark.phase = "failed"
        t = time.monotonic()
        err = assert_error(httpx.post(srv.url + "/v1/completions", json={"prompt": "hi"}, timeout=10), 503)
        assert time.monotonic() - t < 0.4 and err["code"] == "failed"
    with pytest.raises(Exception, match="--ready-wait"):
        ServeConfig(ready_wait=-1)
