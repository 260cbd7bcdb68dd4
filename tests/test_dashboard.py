"""The live view's data: the per-request plain flag in the engine, /dashboard/state,
the race, and the API key on both.

The servers run the real default model (fp32) with its shipped DSpark drafter and a
synthetic step-time table (no profiling), and without speculation; outputs are
greedy and short. The pages in a real browser: test_live_browser.py.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

from dspark.engine.config import SpeculativeConfig
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.sampling import SamplingParams
from dspark.schedule.step_time import StepTimeTable
from dspark.serve import ServeConfig, ServerThread, create_app

KEY = "live-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def spec_engine(target, max_num_seqs: int = 8) -> LLMEngine:
    table = StepTimeTable.synthetic(base_ms=30, knee=24, per_token_ms=1.5, max_tokens=512, drafter_ms=5)
    # the synthetic table as it is (not corrected by measured steps): the race must show drafts;
    # the plain-decoding fallback governs 4 requests and more (the race's one request drafts;
    # hybrid drafting, whose drafter below that is governed against lookup alone)
    spec = SpeculativeConfig(method="dspark", enable_adaptive_verification=True, live_step_time=False,
                             plain_fallback=4, lookup=True)
    return LLMEngine(target, spec, EngineConfig(max_num_seqs=max_num_seqs, max_model_len=512), step_table=table)


@pytest.fixture(scope="module")
def spec_server(default_target_fp32):
    app = create_app(spec_engine(default_target_fp32), ServeConfig(api_key=KEY, log_interval=0))
    with ServerThread(app) as srv:
        yield srv


@pytest.fixture(scope="module")
def plain_server(default_target_fp32):
    engine = LLMEngine(default_target_fp32, None, EngineConfig(max_num_seqs=4, max_model_len=512))
    with ServerThread(create_app(engine, ServeConfig(log_interval=0))) as srv:
        yield srv


def race(url: str, prompt: str, max_tokens: int, headers: dict | None = None) -> list[dict]:
    with httpx.stream("POST", url + "/dashboard/race", json={"prompt": prompt, "max_tokens": max_tokens},
                      headers=headers, timeout=300) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


def test_a_plain_request_in_a_speculative_engine_is_never_drafted_and_stays_exact(default_target_fp32):
    tok = default_target_fp32.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "Count from one to twenty in words."}])
    params = SamplingParams(max_tokens=40)
    ref = LLMEngine(default_target_fp32, None, EngineConfig(max_num_seqs=2, max_model_len=512)).generate(
        [prompt], params)[0].output_ids
    engine = spec_engine(default_target_fp32, 2)
    # the drafter held on (hybrid drafting starts with lookup alone, and this prompt has nothing to copy)
    engine.drafter_or_lookup.on = lambda num_requests: True
    plain = engine.add_request(prompt, params, speculate=False)
    spec = engine.add_request(prompt, params)
    while engine.has_unfinished():
        engine.step()
    assert plain.output_ids == spec.output_ids == ref
    # one step per token, and one more for the end-of-sequence token when that ended it
    assert plain.stats.draft_tokens == 0 and plain.num_steps == len(ref) + (plain.finish_reason == "stop")
    assert spec.stats.draft_tokens > 0 and spec.num_steps < plain.num_steps
    assert engine.runner.drafter.num_requests() == 0  # the plain request never reached the drafter
    steps = list(engine.recent_steps)
    assert all(len(r.verify_lengths) <= 2 for r in steps) and any(max(r.verify_lengths, default=0) > 0 for r in steps)


def test_pages_are_served_from_the_package_and_open(spec_server):
    for path, marker in [("/", "dashboard.js"), ("/race", "race.js")]:
        r = httpx.get(spec_server.url + path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html") and marker in r.text
    for name in ("common.js", "charts.js", "dashboard.js", "race.js", "live.css"):
        assert httpx.get(spec_server.url + "/static/" + name).status_code == 200
    assert httpx.get(spec_server.url + "/static/../app.py").status_code == 404
    assert httpx.get(spec_server.url + "/static/app.py").json()["error"]["code"] == "unknown_url"
    assert httpx.get(spec_server.url + "/dashboard/config").json()["key_required"] is True


def test_data_and_race_require_the_key_when_the_api_does(spec_server, plain_server):
    r = httpx.get(spec_server.url + "/dashboard/state")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(spec_server.url + "/dashboard/state", headers={"Authorization": "Bearer nope"}).status_code == 401
    r = httpx.post(spec_server.url + "/dashboard/race", json={"prompt": "hi", "max_tokens": 4})
    assert r.status_code == 401
    assert httpx.get(spec_server.url + "/dashboard/state", headers=AUTH).status_code == 200
    # without --api-key both are as open as the API
    assert httpx.get(plain_server.url + "/dashboard/config").json()["key_required"] is False
    assert httpx.get(plain_server.url + "/dashboard/state").status_code == 200


def test_race_bad_input_gets_an_openai_style_error(spec_server):
    for body, param in [({}, "prompt"), ({"prompt": "  "}, "prompt"), ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
                        ({"prompt": "x", "max_tokens": True}, "max_tokens")]:
        r = httpx.post(spec_server.url + "/dashboard/race", json=body, headers=AUTH)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx.post(spec_server.url + "/dashboard/race", content=b"{", headers=AUTH)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


def test_state_moves_after_requests_and_reports_the_scheduler(spec_server):
    url = spec_server.url
    before = httpx.get(url + "/dashboard/state", headers=AUTH).json()
    assert before["phase"] == "ready" and before["speculative"]["method"] == "dspark"
    assert before["table"]["tokens"] and len(before["table"]["tokens"]) == len(before["table"]["ms"])
    r = httpx.post(url + "/v1/completions", headers=AUTH, timeout=300,
                   json={"prompt": "The history of the printing press", "max_tokens": 24, "temperature": 0})
    assert r.status_code == 200
    after = httpx.get(url + "/dashboard/state", params={"since": before["now"]}, headers=AUTH).json()
    assert after["totals"]["generation_tokens"] == before["totals"]["generation_tokens"] + 24
    new_steps = after["steps"]
    assert new_steps and all(s[0] > before["now"] for s in new_steps)
    assert sum(s[4] for s in new_steps) >= 24  # tokens emitted by those steps
    # the verification lengths of those steps are the scheduler's decisions the counters add up
    assert all(len(s[5]) <= 1 for s in new_steps)  # one request decoding
    assert after["totals"]["drafts"] - before["totals"]["drafts"] == sum(L > 0 for s in new_steps for L in s[5])
    assert after["totals"]["draft_tokens"] - before["totals"]["draft_tokens"] == sum(sum(s[5]) for s in new_steps)
    assert set(after["events"]) >= {"drafter_skips", "drafter_faults", "thread_fallbacks", "threads"}
    # one request: below the fallback's levels, so speculation ran and no level was governed
    fallback = after["fallback"]
    assert fallback["from_requests"] == 4 and fallback["levels"] == []
    # ... but the hybrid's drafter was, against lookup alone, at the level of one request
    [level] = fallback["drafter_levels"]
    assert fallback["drafter_modes"] == ["drafter", "lookup"]
    assert level["requests"] == "1-1" and level["steps"]["lookup"] > 0  # lookup alone first
    # ... and /metrics says so (the drafter off at that level, and the steps it sat out)
    text = httpx.get(url + "/metrics", headers=AUTH, timeout=30).text
    on = re.search(r'^dspark:spec_decode_drafter_on\{[^}]*requests="1-1"[^}]*\} (\S+)$', text, re.M)
    off = re.search(r"^dspark:spec_decode_drafter_off_steps_total(?:\{[^}]*\})? (\S+)$", text, re.M)
    assert on and float(on.group(1)) == (1.0 if level["mode"] == "drafter" else 0.0)
    assert off and float(off.group(1)) >= level["steps"]["lookup"]
    # only steps after `since`: a poll carries the news, not the whole ring buffer
    again = httpx.get(url + "/dashboard/state", params={"since": new_steps[-1][0]}, headers=AUTH).json()
    assert again["steps"] == []
    r = httpx.get(url + "/dashboard/state", params={"since": "soon"}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == "since"


def test_race_streams_both_sides_and_they_are_identical(spec_server):
    events = race(spec_server.url, "List three facts about the Moon.", 48, AUTH)
    assert events[0]["type"] == "start" and events[0]["speculative"] is True
    done = {e["side"]: e for e in events if e["type"] == "done"}
    pieces = {side: [p for e in events if e["type"] == "tokens" and e["side"] == side for p in e["pieces"]]
              for side in ("plain", "spec")}
    assert "".join(p[0] for p in pieces["plain"]) == "".join(p[0] for p in pieces["spec"])
    assert not any(p[1] for p in pieces["plain"])  # nothing drafted on the plain side
    assert sum(p[1] for p in pieces["spec"]) == done["spec"]["accepted"] > 0
    assert done["plain"]["tokens"] == done["spec"]["tokens"]
    eos = {side: int(done[side]["finish_reason"] == "stop") for side in done}  # the step that emitted EOS
    assert done["plain"]["steps"] == done["plain"]["tokens"] + eos["plain"]
    assert done["spec"]["steps"] - eos["spec"] <= done["spec"]["tokens"] - done["spec"]["accepted"]
    assert done["spec"]["steps"] < done["plain"]["steps"]
    verdict = events[-1]
    assert verdict["type"] == "verdict" and verdict["identical"] is True


def test_plain_server_state_and_race(plain_server):
    st = httpx.get(plain_server.url + "/dashboard/state").json()
    assert st["speculative"] is None and st["table"] is None
    events = race(plain_server.url, "Name a colour.", 8)
    assert events[0]["speculative"] is False
    done = {e["side"]: e for e in events if e["type"] == "done"}
    assert done["spec"]["accepted"] == 0 and done["spec"]["steps"] == done["plain"]["steps"]
    assert events[-1]["identical"] is True


def test_grafana_dashboard_uses_only_metrics_the_server_exports():
    import re
    from importlib import resources

    from dspark.serve.metrics import ServingMetrics

    board = json.loads(resources.files("dspark.serve").joinpath("grafana", "dspark.json").read_text())
    m = ServingMetrics("x")
    exported = {f.name for f in m._families + m._calibration_families + m._hybrid_families}
    used = {re.sub(r"_(bucket|sum|count)$", "", name) for p in board["panels"] for t in p["targets"]
            for name in re.findall(r"dspark:[a-z_]+", t["expr"])}
    assert len(board["panels"]) >= 8 and used and used <= exported, used - exported
    assert all(p["fieldConfig"]["defaults"]["unit"] for p in board["panels"])  # units on every panel
