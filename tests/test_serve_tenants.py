"""Tenants on one `dspark serve` (dspark.serve.tenants): namespaces from keys and
`cache_salt`, the prefix cache and the reply history kept apart by them, several keys,
/metrics and the live view closed to others, and streamed tokens in fixed groups.

The servers run the real default model (fp32, where the prefix cache is on) with
calibrated prompt lookup over earlier replies and a synthetic step-time table (no
profiling); outputs are greedy and short.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from dspark.engine.config import SpeculativeConfig
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.errors import UserError
from dspark.serve import ServeConfig, ServerThread, create_app
from dspark.serve.stream_groups import TokenGroups
from dspark.serve.tenants import MAX_SALT_CHARS, Tenants, keys_from_args

from test_serve import assert_error, scrape, sse_events

K1, K2 = "key-one", "key-two"
SALT = "s3cret-salt-7f1e0c"  # must appear nowhere the server writes
PROMPT = "Explain in a few sentences why the ocean is salty."


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def lookup_engine(target, max_num_seqs: int = 4) -> LLMEngine:
    from test_priced_lookup import _synthetic

    spec = SpeculativeConfig.from_dict({"method": "ngram", "enable_adaptive_verification": True,
                                        "lookup_history": True})
    return LLMEngine(target, spec, EngineConfig(max_num_seqs=max_num_seqs, max_model_len=256),
                     step_table=_synthetic())


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture(scope="module")
def logged():
    handler = _Records()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield handler
    root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="module")
def single(default_target_fp32, logged):
    """One key: requests without a salt share a namespace."""
    app = create_app(lookup_engine(default_target_fp32), ServeConfig(api_key=K1, log_interval=0))
    with ServerThread(app) as srv:
        yield srv


@pytest.fixture(scope="module")
def pair(default_target_fp32, tmp_path_factory, logged):
    """Two tenants from a keys file, one of them with two keys."""
    path = tmp_path_factory.mktemp("keys") / "keys.txt"
    path.write_text(f"# key tenant\n{K1} alice\n{K2} bob\nkey-one-rotated alice\n")
    app = create_app(lookup_engine(default_target_fp32), ServeConfig(api_keys_file=str(path), log_interval=0,
                                                                     stream_chunk_tokens=4))
    with ServerThread(app) as srv:
        yield srv


def complete(url: str, key: str, salt: str | None = None, header: str | None = None, prompt: str = PROMPT,
             max_tokens: int = 12, stream: bool = False) -> str:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if salt is not None:
        body["cache_salt"] = salt
    headers = auth(key) | ({"X-Cache-Salt": header} if header is not None else {})
    if stream:
        with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, headers=headers,
                          timeout=300) as r:
            assert r.status_code == 200, r.read()
            events = list(sse_events(r))
        assert events[-1] == "[DONE]"
        return "".join(e["choices"][0]["text"] for e in events[:-1])
    r = httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def hits(srv, key: str) -> float:
    return scrape_with(srv.url, key)["dspark:prefix_cache_hits_total"]


def scrape_with(url: str, key: str) -> dict[str, float]:
    import test_serve

    saved = test_serve.AUTH
    test_serve.AUTH = auth(key)
    try:
        return scrape(url)
    finally:
        test_serve.AUTH = saved


# --- namespaces on one key ------------------------------------------------------------------
def test_a_salt_opens_its_own_namespace_and_output_stays_the_targets(single):
    url = single.url
    plain = complete(url, K1)
    before = hits(single, K1)
    assert complete(url, K1, salt="a") == plain
    assert complete(url, K1, salt="b") == plain
    assert hits(single, K1) == before  # "a" then "b": neither finds the other's prompt nor the unsalted one
    assert complete(url, K1, salt="a") == plain
    after_a = hits(single, K1)
    assert after_a > before  # "a" twice: the second reuses the first (the paired control)
    # the header wins over the body: "a" in the body under a header "c" is namespace "c"
    assert complete(url, K1, salt="a", header="c") == plain and hits(single, K1) == after_a
    assert complete(url, K1, header="a") == plain and hits(single, K1) > after_a
    # requests without a salt share one namespace, as in vLLM
    without = hits(single, K1)
    assert complete(url, K1) == plain and hits(single, K1) > without
    assert complete(url, K1, salt="a", stream=True) == plain


def test_a_bad_salt_is_a_400_that_does_not_repeat_it(single):
    url = single.url + "/v1/completions"
    body = {"prompt": "hi", "max_tokens": 2}
    for salt in ("", "x" * (MAX_SALT_CHARS + 1), 7, ["a"], {"a": 1}, True):
        err = assert_error(httpx.post(url, json={**body, "cache_salt": salt}, headers=auth(K1), timeout=60), 400)
        assert err["param"] == "cache_salt" and err["code"] == "invalid_cache_salt"
        assert "x" * 50 not in err["message"]
    err = assert_error(httpx.post(url, json=body, headers=auth(K1) | {"X-Cache-Salt": ""}, timeout=60), 400)
    assert err["code"] == "invalid_cache_salt"
    ok = httpx.post(url, json={**body, "cache_salt": "x" * MAX_SALT_CHARS}, headers=auth(K1), timeout=60)
    assert ok.status_code == 200, ok.text
    assert single.app.state.dspark.async_engine.alive


# --- several keys ---------------------------------------------------------------------------
def test_two_tenants_authenticate_and_never_share_a_namespace(pair):
    url = pair.url
    for key in (K1, K2, "key-one-rotated"):
        assert httpx.get(url + "/v1/models", headers=auth(key), timeout=30).status_code == 200
    for headers in ({}, auth("key-three"), auth(K1 + "x"), auth(K1[:-1]), {"Authorization": K1}):
        assert assert_error(httpx.get(url + "/v1/models", headers=headers, timeout=30), 401)["code"] == \
            "invalid_api_key"
    ref = complete(url, K1, salt=SALT, prompt=PROMPT + " Be brief.")
    before = hits(pair, K1)
    # bob with alice's salt, and bob without one: his own namespaces, no hits
    assert complete(url, K2, salt=SALT, prompt=PROMPT + " Be brief.") == ref
    assert complete(url, K2, prompt=PROMPT + " Be brief.") == ref
    assert hits(pair, K1) == before
    # alice again, through her other key: her namespace (the paired control)
    assert complete(url, "key-one-rotated", salt=SALT, prompt=PROMPT + " Be brief.") == ref
    assert hits(pair, K1) > before
    # with several tenants even unsalted requests are per tenant
    complete(url, K1, prompt="Name three primary colors.")
    before = hits(pair, K1)
    complete(url, K2, prompt="Name three primary colors.")
    assert hits(pair, K1) == before


def test_metrics_need_a_key_unless_made_public(pair, default_target_fp32):
    assert_error(httpx.get(pair.url + "/metrics", timeout=30), 401)
    assert_error(httpx.get(pair.url + "/metrics", headers=auth("nobody"), timeout=30), 401)
    assert httpx.get(pair.url + "/metrics", headers=auth(K2), timeout=30).status_code == 200
    engine = LLMEngine(default_target_fp32, None, EngineConfig(max_num_seqs=1, max_model_len=64))
    with ServerThread(create_app(engine, ServeConfig(api_key=[K1, K2], metrics_public=True,
                                                     log_interval=0))) as srv:
        assert httpx.get(srv.url + "/metrics", timeout=30).status_code == 200
        assert_error(httpx.get(srv.url + "/v1/models", timeout=30), 401)


def test_the_live_view_shows_a_tenant_its_own_requests_and_others_as_counts(pair):
    url = pair.url
    with ThreadPoolExecutor(2) as pool:  # decoded in the same steps
        list(pool.map(lambda key: complete(url, key, salt=SALT, prompt="Count from one to twenty.",
                                           max_tokens=24), (K1, K2)))
    views = {}
    for key in (K1, K2):
        r = httpx.get(url + "/dashboard/state", headers=auth(key), timeout=30)
        assert r.status_code == 200
        views[key] = r.json()
        assert views[key]["view"] == "own requests"
    steps = pair.app.state.dspark.engine.recent_steps
    together = [s for s in steps if set(s.owners) == {"alice", "bob"}]
    assert together, "the two requests never shared a step"
    for key, tenant in ((K1, "alice"), (K2, "bob")):
        rows = views[key]["steps"]
        mine = [s for s in steps if tenant in s.owners]
        assert len(rows) == len(mine) > 0
        for row, s in zip(rows, mine):
            own = [L for L, o in zip(s.verify_lengths, s.owners) if o == tenant]
            assert row[5] == own and row[2] == sum(own) + len(own)
            assert row[6] == len(s.owners) - len(own)
            assert row[4] == sum(n for n, o in zip(s.emitted, s.owners) if o == tenant)
        assert any(row[6] > 0 for row in rows)  # the other tenant, as a count
    # the race is its caller's alone, and uses their namespace
    with httpx.stream("POST", url + "/dashboard/race", json={"prompt": "Say hello.", "max_tokens": 6,
                                                             "cache_salt": SALT},
                      headers=auth(K2), timeout=300) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1]["type"] == "verdict" and events[-1]["identical"]
    assert_error(httpx.post(url + "/dashboard/race", json={"prompt": "x", "cache_salt": ""}, headers=auth(K2),
                            timeout=60), 400)


def test_the_raw_salt_is_nowhere_the_server_writes(pair, logged):
    complete(pair.url, K1, salt=SALT)
    complete(pair.url, K1, header=SALT, stream=True)
    pages = [httpx.get(pair.url + "/metrics", headers=auth(K1), timeout=30).text,
             httpx.get(pair.url + "/dashboard/state", headers=auth(K1), timeout=30).text,
             httpx.get(pair.url + "/dashboard/config", timeout=30).text]
    assert logged.lines and not any(SALT in line for line in logged.lines)
    assert not any(SALT in page for page in pages)
    engine = pair.app.state.dspark.engine
    assert SALT not in repr(engine.runner.prefix.summary())
    assert all(SALT not in str(ns) for ns, _ in engine.runner.prefix._entries)
    assert all(SALT not in str(ns) for ns in engine.runner.drafter.reply_history._spaces)


# --- streamed tokens in groups ----------------------------------------------------------------
def test_token_groups_are_fixed_whatever_the_steps():
    g = TokenGroups(4)
    assert g.push([1, 2, 3], False) == []
    assert g.push([4, 5], False) == [[1, 2, 3, 4]]
    assert g.push([6, 7, 8, 9, 10, 11, 12, 13], False) == [[5, 6, 7, 8], [9, 10, 11, 12]]
    assert g.push([14], True) == [[13, 14]]
    assert TokenGroups(2).push([1, 2], True) == [[1, 2], []]  # the finishing chunk, empty
    assert TokenGroups(0).push([1, 2, 3], False) == [[1, 2, 3]] and TokenGroups(0).push([], False) == []
    with pytest.raises(ValueError):
        TokenGroups(-1)


def test_a_grouped_stream_sends_four_tokens_a_chunk_and_the_same_text(pair):
    body = {"prompt": "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3,", "max_tokens": 22, "temperature": 0,
            "ignore_eos": True}
    whole = httpx.post(pair.url + "/v1/completions", json=body, headers=auth(K1), timeout=300).json()
    with httpx.stream("POST", pair.url + "/v1/completions", json={**body, "stream": True}, headers=auth(K1),
                      timeout=300) as r:
        events = list(sse_events(r))[:-1]
    n = whole["usage"]["completion_tokens"]
    assert n == 22 and "".join(e["choices"][0]["text"] for e in events) == whole["choices"][0]["text"]
    assert len(events) == n // 4 + 1  # five full groups, then the last two tokens with the finish reason
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    tok = pair.app.state.dspark.model.tokenizer.tok
    assert [len(tok.encode(e["choices"][0]["text"], add_special_tokens=False)) for e in events[:-1]] == [4] * 5


# --- configuration ------------------------------------------------------------------------------
def test_keys_and_keys_files_are_checked_with_clear_messages(tmp_path):
    assert keys_from_args(["a", "b"], None) == {"a": "key-1", "b": "key-2"}
    with pytest.raises(UserError, match="twice"):
        keys_from_args(["a", "a"], None)
    with pytest.raises(UserError, match="non-empty"):
        ServeConfig(api_key="")
    bad = tmp_path / "keys.txt"
    bad.write_text("only-a-key\n")
    with pytest.raises(UserError, match="line 1: expected 'KEY TENANT'") as e:
        keys_from_args(None, str(bad))
    assert "only-a-key" not in str(e.value)
    bad.write_text("# nothing\n")
    with pytest.raises(UserError, match="no keys"):
        keys_from_args(None, str(bad))
    with pytest.raises(UserError, match="cannot read"):
        keys_from_args(None, str(tmp_path / "missing.txt"))
    with pytest.raises(UserError, match="stream-chunk-tokens"):
        ServeConfig(stream_chunk_tokens=-1)
    one = Tenants({"k": "t"})
    assert one.shared and one.namespace("t", None) is None
    assert one.namespace("t", "a") != one.namespace("t", "b") and one.namespace("t", "a") == one.namespace("t", "a")
    two = Tenants({"k1": "t1", "k2": "t2"})
    assert not two.shared and two.namespace("t1", None) != two.namespace("t2", None)
    assert two.namespace("t1", "s") != two.namespace("t2", "s") != two.namespace("t2", None)
