"""The API fuzzer (`dspark.bench.fuzz`), a small seeded run against a live server.

The server runs n-gram speculation on a small random model that has the default
model's tokenizer: the same validation, tokenization, batching and streaming as the
real model at a fraction of the cost. `dspark bench fuzz` runs 10,000 cases.
"""

from __future__ import annotations

import httpx
import pytest

from dspark.bench.fuzz import FuzzCase, draw_cases, run_cases, write_tiny_model
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.serve import ServeConfig, ServerThread, create_app
from dspark.engine.config import SpeculativeConfig


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    from dspark.runtime.default_model import default_model_dir
    from dspark.runtime.target import Target

    path = tmp_path_factory.mktemp("fuzz") / "tiny"
    write_tiny_model(path, default_model_dir())
    target = Target.load(str(path), dtype="fp32", device="cpu", max_len=64)
    engine = LLMEngine(target, SpeculativeConfig(method="ngram"),
                       EngineConfig(max_num_seqs=4, max_model_len=64, max_waiting=32))
    with ServerThread(create_app(engine, ServeConfig(log_interval=0, served_model_names=["tiny"]))) as srv:
        yield srv


def test_cases_are_reproducible_and_varied():
    a, b = draw_cases(60, seed=3, model_names=["tiny"]), draw_cases(60, seed=3, model_names=["tiny"])
    assert [c.describe() for c in a] == [c.describe() for c in b]
    assert len({c.kind for c in draw_cases(300, seed=0, model_names=["tiny"])}) >= 8


def test_seeded_fuzz_run_has_no_server_error_or_hang(tiny_server):
    report = run_cases(tiny_server.url, draw_cases(250, seed=0, model_names=["tiny"]), timeout=60)
    summary = report.summary()
    assert report.cases == 250 and report.ok, summary
    assert summary["statuses"].get("200", 0) > 0 and summary["statuses"].get("400", 0) > 0, summary
    engine = tiny_server.app.state.dspark.engine
    assert engine.runner.cache.num_free == engine.runner.cache.num_slots
    assert engine.runner.drafter.num_requests() == 0


def test_the_checker_catches_a_broken_server(tiny_server):
    """The property can fail: a route that answers 500, or a 4xx without OpenAI's shape."""
    from fastapi.responses import JSONResponse, PlainTextResponse

    app = tiny_server.app
    app.add_api_route("/v1/broken", lambda: JSONResponse({"oops": 1}, status_code=500), methods=["POST"])
    app.add_api_route("/v1/plain-error", lambda: PlainTextResponse("nope", status_code=400), methods=["POST"])
    report = run_cases(tiny_server.url, [FuzzCase("POST", "/v1/broken", b"{}"),
                                          FuzzCase("POST", "/v1/plain-error", b"{}")], timeout=30)
    assert not report.ok and len(report.server_errors) == 1 and len(report.bad_shapes) == 1
    assert httpx.get(tiny_server.url + "/health", timeout=10).status_code == 200
