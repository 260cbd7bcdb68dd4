"""`dspark serve`: the OpenAI-compatible API against a live in-process server.

The server runs the real default model (fp32) with n-gram speculation, so nothing
here needs a shipped drafter. Outputs are greedy and short to keep the module fast
on a small CPU.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.sampling import SamplingParams
from dspark.serve import ServeConfig, ServerThread, create_app
from dspark.engine.config import SpeculativeConfig

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL = "SmolLM2-135M-Instruct"
REPETITIVE = "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3,"


@pytest.fixture(scope="module")
def server(default_target_fp32):
    engine = LLMEngine(default_target_fp32, SpeculativeConfig(method="ngram"),
                       EngineConfig(max_num_seqs=16, max_model_len=256))
    app = create_app(engine, ServeConfig(api_key=KEY, log_interval=0))
    with ServerThread(app) as srv:
        yield srv


def scrape(url: str) -> dict[str, float]:
    """/metrics as {'name' or 'name{label="v"}': value}, without the model_name label."""
    text = httpx.get(url + "/metrics", headers=AUTH, timeout=30).text  # a keyed server keys /metrics too
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r'([^{ ]+)(?:\{(.*)\})? (\S+)', line)
        labels = [p for p in (m.group(2) or "").split(",") if p and not p.startswith("model_name=")]
        out[m.group(1) + ("{" + ",".join(labels) + "}" if labels else "")] = float(m.group(3))
    return out


def wait_until(predicate, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def sse_events(response: httpx.Response):
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            yield data if data == "[DONE]" else json.loads(data)


def assert_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    return err


# --- the official client --------------------------------------------------------------
def test_openai_client_chat_and_completions(server):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    assert [m.id for m in client.models.list().data] == [MODEL]

    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, temperature=0)
    text = chat.choices[0].message.content
    assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant" and text
    assert chat.choices[0].finish_reason in ("stop", "length")
    u = chat.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 6
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens

    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text  # greedy
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == chat.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == u.total_tokens
    assert all(c.usage is None for c in chunks[:-1])

    comp = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5,
                                     temperature=0)
    assert comp.object == "text_completion" and comp.choices[0].text
    assert comp.usage.completion_tokens == 5 and comp.choices[0].finish_reason == "length"
    streamed = list(client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5,
                                              temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == comp.choices[0].text
    assert streamed[-1].choices[0].finish_reason == "length"

    # A stop string ends the output before it, streamed or not.
    cut = comp.choices[0].text[3:6]
    stopped = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5,
                                        temperature=0, stop=[cut])
    assert stopped.choices[0].text == comp.choices[0].text[: comp.choices[0].text.find(cut)]
    assert stopped.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5,
                                              temperature=0, stop=cut, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == stopped.choices[0].text


# --- batching is exact ------------------------------------------------------------------
QUESTIONS = ["What is 2 + 2?", "Name a color.", "Say hello.", "What is the capital of Italy?",
             "Name a fruit.", "Count to three.", "What is water made of?", "Name an animal."]
STARTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "The sky is blue because",
          "1, 2, 3, 4,", "Water boils at", "My favourite food is", "import numpy as"]


def test_16_concurrent_greedy_requests_equal_offline_generation(server, default_target_fp32):
    target = default_target_fp32
    max_tokens = 8
    jobs = [("chat", q, i % 2 == 0) for i, q in enumerate(QUESTIONS)] + \
           [("completion", p, i % 2 == 1) for i, p in enumerate(STARTS)]

    def call(job) -> str:
        kind, text, stream = job
        body = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
        if kind == "chat":
            url, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": text}]
        else:
            url, body["prompt"] = "/v1/completions", text
        if not stream:
            r = httpx.post(server.url + url, json=body, headers=AUTH, timeout=300)
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            return choice["message"]["content"] if kind == "chat" else choice["text"]
        with httpx.stream("POST", server.url + url, json=body, headers=AUTH, timeout=300) as r:
            assert r.status_code == 200
            events = list(sse_events(r))
        assert events[-1] == "[DONE]"
        return "".join(e["choices"][0]["delta"].get("content", "") if kind == "chat" else e["choices"][0]["text"]
                       for e in events[:-1])

    with ThreadPoolExecutor(len(jobs)) as pool:
        served = list(pool.map(call, jobs))

    prompts = [target.tokenizer.apply_chat_template([{"role": "user", "content": t}]) if k == "chat"
               else target.tokenizer.tok.encode(t, add_special_tokens=True) for k, t, _ in jobs]
    offline = LLMEngine(target, None, EngineConfig(max_num_seqs=16, max_model_len=256))
    seqs = offline.generate(prompts, SamplingParams(max_tokens=max_tokens))
    assert served == [offline.final_text(s) for s in seqs]


# --- bad input --------------------------------------------------------------------------------
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server):
    url = server.url
    chat, comp = url + "/v1/chat/completions", url + "/v1/completions"
    msgs = [{"role": "user", "content": "hi"}]
    post = lambda u, body, **kw: httpx.post(u, json=body, headers=kw.get("headers", AUTH), timeout=60)  # noqa: E731

    assert_error(httpx.post(comp, content=b'{"prompt": "x",', headers=AUTH, timeout=60), 400)
    assert_error(httpx.post(comp, content=b"[1, 2]", headers=AUTH, timeout=60), 400)
    for body, param in [
        ({"model": MODEL}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages"),
        ({"messages": msgs, "max_tokens": "ten"}, "max_tokens"),
        ({"messages": msgs, "max_tokens": 0}, "max_tokens"),
        ({"messages": msgs, "max_completion_tokens": 1.5}, "max_completion_tokens"),
        ({"messages": msgs, "temperature": -0.5}, "temperature"),
        ({"messages": msgs, "temperature": 3}, "temperature"),
        ({"messages": msgs, "temperature": "hot"}, "temperature"),
        ({"messages": msgs, "top_p": 0}, "top_p"),
        ({"messages": msgs, "top_k": -3}, "top_k"),
        ({"messages": msgs, "seed": 2**70}, "seed"),
        ({"messages": msgs, "stop": [1, 2]}, "stop"),
        ({"messages": msgs, "stream": "yes"}, "stream"),
        ({"messages": msgs, "n": 2}, "n"),
        ({"messages": msgs, "model": "gpt-4"}, "model"),
        ({"messages": msgs, "max_tokens": 1000}, "max_tokens"),  # prompt + output over 256
        ({"messages": msgs, "stream_options": {"include_usage": True}}, "stream_options"),
        ({"messages": msgs, "logprobs": True}, "logprobs"),
    ]:
        err = assert_error(post(chat, body), 400)
        assert err["param"] == param, (body, err)
    for body, param in [
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [1, 10**9]}, "prompt"),
        ({"prompt": "word " * 400}, "prompt"),  # over the context limit
        ({"prompt": "a" * 3_000_000}, "prompt"),  # refused by its length, before tokenizing
        ({"prompt": "x", "ignore_eos": 1}, "ignore_eos"),
    ]:
        err = assert_error(post(comp, body), 400)
        assert err["param"] == param, (body, err)
    assert assert_error(post(comp, {"prompt": "x", "model": "nope"}), 400)["code"] == "model_not_found"

    assert assert_error(post(chat, {"messages": msgs}, headers={}), 401)["code"] == "invalid_api_key"
    assert_error(post(chat, {"messages": msgs}, headers={"Authorization": "Bearer wrong"}), 401)
    assert_error(post(chat, {"messages": msgs}, headers={"Authorization": KEY}), 401)
    assert_error(httpx.get(url + "/v1/models", timeout=60), 401)
    assert_error(httpx.get(url + "/v1/nothing-here", headers=AUTH, timeout=60), 404)
    assert_error(httpx.post(url + "/v2/chat/completions", json={}, headers=AUTH, timeout=60), 404)
    assert_error(httpx.get(chat, headers=AUTH, timeout=60), 405)
    # bodies over the limit (4 MiB by default): 413, whether declared or streamed without a length
    big = b'{"prompt": "' + b"a" * (5 * 2**20) + b'"}'
    assert assert_error(httpx.post(comp, content=big, headers=AUTH, timeout=60), 413)["code"] == "request_too_large"
    chunks = iter([big[i:i + 2**20] for i in range(0, len(big), 2**20)])
    assert_error(httpx.post(comp, content=chunks, headers=AUTH, timeout=60), 413)
    assert_error(httpx.post(comp, content=b"[" * 100_000 + b"]" * 100_000, headers=AUTH, timeout=60), 400)
    for prompt in (rb"\ud800", rb"a\udfffb"):  # lone surrogates, escaped in valid JSON
        r = httpx.post(comp, content=b'{"prompt": "' + prompt + b'", "max_tokens": 2}', headers=AUTH,
                       timeout=60)
        assert r.status_code in (200, 400), r.text

    r = post(chat, {"model": MODEL, "messages": msgs, "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0
    assert httpx.get(url + "/health", timeout=30).status_code == 200
    assert server.app.state.dspark.async_engine.alive


# --- disconnects and metrics ---------------------------------------------------------------------
def test_client_disconnect_aborts_and_frees_the_kv_slot(server):
    cache = server.app.state.dspark.engine.runner.cache
    aborted = scrape(server.url)['dspark:request_success_total{finished_reason="abort"}']
    body = {"model": MODEL, "prompt": "Tell me a long story.", "max_tokens": 200, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=AUTH, timeout=120) as r:
        assert r.status_code == 200
        events = sse_events(r)  # kept: closing the generator would close the connection
        for _ in range(3):
            next(events)
        assert scrape(server.url)["dspark:num_requests_running"] == 1
    # The connection is closed here, long before 200 tokens.
    assert wait_until(lambda: scrape(server.url)["dspark:num_requests_running"] == 0, timeout=20)
    assert cache.num_free == cache.num_slots
    m = scrape(server.url)
    assert m["dspark:kv_cache_usage_perc"] == 0
    assert m["dspark:kv_slots_used"] == 0 and m["dspark:spec_decode_drafter_requests"] == 0  # the leak gauges
    assert "dspark:spec_decode_request_skips_total" in m  # exported from the start
    assert m['dspark:request_success_total{finished_reason="abort"}'] == aborted + 1

    # A client that gives up on a non-streamed request is noticed too.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json={**body, "stream": False}, headers=AUTH, timeout=1.5)
    assert wait_until(lambda: scrape(server.url)['dspark:request_success_total{finished_reason="abort"}']
                      == aborted + 2, timeout=20)
    assert wait_until(lambda: cache.num_free == cache.num_slots, timeout=5)


def test_metrics_count_speculation_per_step(server):
    before = scrape(server.url)
    body = {"model": MODEL, "prompt": REPETITIVE, "max_tokens": 60, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=AUTH, timeout=120) as r:
        events = sse_events(r)
        for _ in range(3):
            next(events)
        during = scrape(server.url)  # the request is still running
        assert during["dspark:num_requests_running"] == 1
        assert during["dspark:spec_decode_num_drafts_total"] > before["dspark:spec_decode_num_drafts_total"]
        assert during["dspark:generation_tokens_total"] > before["dspark:generation_tokens_total"]
        ttft = "dspark:time_to_first_token_seconds_count"
        assert during[ttft] == before[ttft] + 1
        rest = list(events)
    assert rest[-1] == "[DONE]"
    after = scrape(server.url)
    d = {k: after[k] - before.get(k, 0) for k in after}
    # n-gram lookup continues the repeated pattern, so drafts are accepted.
    assert d["dspark:spec_decode_num_accepted_tokens_total"] > 0
    assert d["dspark:spec_decode_num_draft_tokens_total"] >= d["dspark:spec_decode_num_accepted_tokens_total"]
    per_pos = [v for k, v in d.items() if k.startswith("dspark:spec_decode_num_accepted_tokens_per_pos_total")]
    assert sum(per_pos) == d["dspark:spec_decode_num_accepted_tokens_total"]
    assert d["dspark:generation_tokens_total"] == 60
    assert d['dspark:request_success_total{finished_reason="length"}'] == 1
    assert d["dspark:e2e_request_latency_seconds_count"] == 1
    assert d["dspark:inter_token_latency_seconds_count"] == 59
    # Fewer engine steps than tokens: speculation emitted several tokens per step.
    assert d["dspark:spec_decode_num_drafts_total"] < 59


# --- a small server: the waiting queue and engine faults ---------------------------------------------
@pytest.fixture
def tiny_server(default_target_fp32):
    engine = LLMEngine(default_target_fp32, None, EngineConfig(max_num_seqs=1, max_waiting=1, max_model_len=256))
    with ServerThread(create_app(engine, ServeConfig(log_interval=0))) as srv:
        yield srv


def test_full_waiting_queue_answers_429(tiny_server):
    url = tiny_server.url + "/v1/completions"
    long = {"prompt": "Tell me a story.", "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url, json=long, timeout=120) as running:
        events = sse_events(running)  # kept: closing the generator would close the connection
        next(events)  # admitted: it holds the only batch slot
        with httpx.stream("POST", url, json=long, timeout=120) as waiting:
            assert waiting.status_code == 200  # accepted into the waiting queue
            assert scrape(tiny_server.url)["dspark:num_requests_waiting"] == 1
            err = assert_error(httpx.post(url, json={"prompt": "hi", "max_tokens": 2}, timeout=60), 429)
            assert err["code"] == "queue_full"
    assert wait_until(lambda: scrape(tiny_server.url)["dspark:num_requests_running"] == 0, timeout=20)
    r = httpx.post(url, json={"prompt": "hi", "max_tokens": 2, "temperature": 0}, timeout=60)
    assert r.status_code == 200


def break_once(obj, name: str) -> None:
    """Make `obj.name` raise on its next call only."""
    real = getattr(obj, name)

    def broken(*args, **kwargs):
        setattr(obj, name, real)
        raise RuntimeError("injected fault")

    setattr(obj, name, broken)


@pytest.mark.parametrize("where", ["step", "add"])  # the batched forward, or admitting a request
def test_a_failing_step_errors_its_requests_and_the_engine_goes_on(tiny_server, where):
    runner = tiny_server.app.state.dspark.engine.runner
    url = tiny_server.url + "/v1/completions"
    break_once(runner, where)
    err = assert_error(httpx.post(url, json={"prompt": "hi", "max_tokens": 3}, timeout=60), 500)
    assert "injected fault" in err["message"] and err["type"] == "server_error"
    assert runner.cache.num_free == runner.cache.num_slots

    break_once(runner, where)
    body = {"prompt": "hi", "max_tokens": 3, "stream": True}
    with httpx.stream("POST", url, json=body, timeout=60) as r:
        events = list(sse_events(r))
    assert "injected fault" in events[0]["error"]["message"] and events[-1] == "[DONE]"

    r = httpx.post(url, json={"prompt": "hi", "max_tokens": 3, "temperature": 0}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0
    assert scrape(tiny_server.url)["dspark:request_error_total"] == 2
    assert tiny_server.app.state.dspark.async_engine.alive
