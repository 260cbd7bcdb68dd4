"""Property-based fuzzing of an OpenAI-compatible server's HTTP API.

Cases are drawn by hypothesis (seeded, so a run is reproducible) and sent to a
running server: mutations of valid chat and completion requests (fields of wrong
type, missing, extra, huge or negative numbers, NaN and Infinity, lone surrogates,
deep nesting), arbitrary JSON, bytes that are not UTF-8, bodies of several
megabytes, odd methods, paths and headers, streamed and not. The property: every
answer is 2xx or 4xx, never 5xx; every 4xx from /v1/* has OpenAI's error shape;
every response completes (a streamed 200 ends with `data: [DONE]`) within the
timeout; and the server is healthy and still generates afterwards.

    from dspark.bench.fuzz import draw_cases, run_cases
    report = run_cases("http://127.0.0.1:8000", draw_cases(1000, seed=0))
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/metrics", "/health")
GENERATION_ROUTES = ROUTES[:2]


@dataclass(frozen=True)
class LargeBody:
    """A body of `size` bytes, built only when sent (thousands of them would not fit
    in memory at once)."""

    field: str  # "prompt" or "messages"
    word: str
    size: int

    def build(self) -> bytes:
        payload = self.word * (self.size // len(self.word.encode()))
        obj = {"prompt": payload} if self.field == "prompt" else {"messages": [{"role": "user", "content": payload}]}
        return json.dumps(obj).encode()


@dataclass
class FuzzCase:
    method: str
    path: str
    body: bytes | LargeBody | None
    headers: dict[str, str] = field(default_factory=dict)
    kind: str = ""  # what the case mutates, for the report

    def describe(self, limit: int = 300) -> str:
        if isinstance(self.body, LargeBody):
            b = self.body
            return f"{self.method} {self.path} [{self.kind}] headers={self.headers} body=<{b.size} bytes of {b.field} {b.word!r}...>"
        body = b"" if self.body is None else self.body
        shown = body[:limit].decode("utf-8", "backslashreplace")
        more = f"... ({len(body)} bytes)" if len(body) > limit else ""
        return f"{self.method} {self.path} [{self.kind}] headers={self.headers} body={shown}{more}"


@dataclass
class FuzzReport:
    cases: int = 0
    statuses: Counter = field(default_factory=Counter)
    kinds: Counter = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)  # 5xx answers
    bad_shapes: list[str] = field(default_factory=list)  # 4xx without OpenAI's error body
    hangs: list[str] = field(default_factory=list)  # no complete answer within the timeout
    broken_streams: list[str] = field(default_factory=list)  # a streamed 200 without [DONE]
    healthy_after: bool = False
    generates_after: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.server_errors or self.bad_shapes or self.hangs or self.broken_streams) \
            and self.healthy_after and self.generates_after

    def summary(self) -> dict:
        return {"cases": self.cases, "ok": self.ok, "seconds": round(self.seconds, 1),
                "statuses": {str(k): v for k, v in sorted(self.statuses.items(), key=lambda kv: str(kv[0]))},
                "kinds": dict(sorted(self.kinds.items())),
                "server_errors": len(self.server_errors), "bad_error_shapes": len(self.bad_shapes),
                "hangs": len(self.hangs), "broken_streams": len(self.broken_streams),
                "healthy_after": self.healthy_after, "generates_after": self.generates_after,
                "examples": {"server_errors": self.server_errors[:5], "bad_error_shapes": self.bad_shapes[:5],
                             "hangs": self.hangs[:5], "broken_streams": self.broken_streams[:5]}}


# --- drawing cases ---------------------------------------------------------------------
def _strategies(model_names: list[str]):
    from hypothesis import strategies as st

    texts = st.one_of(st.text(max_size=40),  # includes lone surrogates
                      st.sampled_from(["", " ", "\x00", "\ud800", "\udfff x", "<|im_end|>", "<|endoftext|>",
                                       "\u202e\u0000\uffff", "🙂" * 20, "a" * 2000]))
    numbers = st.one_of(
        st.integers(-3, 300), st.integers(), st.sampled_from([2**31, 2**63, -(2**63) - 1, 10**40, -1, 0]),
        st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0]))
    scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
    anything = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                            max_leaves=12)
    models = st.one_of(st.sampled_from(model_names), anything)
    roles = st.one_of(st.sampled_from(["system", "user", "assistant", "developer", "tool", "USER", ""]), anything)
    message = st.fixed_dictionaries({"role": roles, "content": st.one_of(
        texts, anything, st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]),
                                                        "text": st.one_of(texts, anything)}), max_size=3))})
    small_max = st.integers(1, 6)
    fields = {  # every field a request may carry, each with values good and bad
        "model": models,
        "max_tokens": st.one_of(small_max, numbers, anything),
        "max_completion_tokens": st.one_of(small_max, numbers),
        "temperature": st.one_of(st.floats(0, 2), numbers, anything),
        "top_p": st.one_of(st.floats(0, 1), numbers),
        "top_k": st.one_of(st.integers(-2, 100), numbers),
        "seed": st.one_of(st.integers(-(2**63), 2**63 - 1), numbers, anything),
        "stop": st.one_of(texts, st.lists(texts, max_size=5), anything),
        "stream": st.one_of(st.booleans(), anything),
        "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": st.one_of(st.booleans(), anything)}),
                                    anything),
        "n": st.one_of(st.integers(-1, 3), anything),
        "ignore_eos": st.one_of(st.booleans(), anything),
        "logprobs": anything, "presence_penalty": numbers, "logit_bias": anything, "tools": anything,
        "response_format": anything, "echo": anything, "best_of": numbers, "user": anything,
    }
    chat = st.fixed_dictionaries({"messages": st.one_of(st.lists(message, min_size=1, max_size=3), anything)},
                                 optional=fields)
    completion = st.fixed_dictionaries(
        {"prompt": st.one_of(texts, st.lists(st.integers(-5, 60000), max_size=8),
                             st.lists(texts, max_size=2), anything)},
        optional=fields)
    return st, anything, chat, completion


def draw_cases(num_cases: int, seed: int = 0, model_names: list[str] | None = None) -> list[FuzzCase]:
    """`num_cases` cases, the same ones for the same seed."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    st, anything, chat, completion = _strategies(model_names or ["default"])
    header_values = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30).map(str.strip)
    odd_headers = st.dictionaries(
        st.sampled_from(["content-type", "authorization", "accept", "x-request-id", "x-anything", "accept-encoding",
                         "content-encoding", "user-agent"]), header_values, max_size=3)

    @st.composite
    def case(draw) -> FuzzCase:
        kind = draw(st.sampled_from(["chat", "chat", "chat", "completion", "completion", "completion", "json",
                                     "bytes", "nested", "large", "method", "path", "get"]))
        path = draw(st.sampled_from(GENERATION_ROUTES))
        headers = {"content-type": "application/json"}
        if draw(st.integers(0, 4)) == 0:
            headers = draw(odd_headers)
        method, body = "POST", None
        if kind in ("chat", "completion"):
            obj = draw(chat if kind == "chat" else completion)
            path = GENERATION_ROUTES[0] if kind == "chat" else GENERATION_ROUTES[1]
            if draw(st.booleans()) and isinstance(obj.get("max_tokens"), float):
                obj["max_tokens"] = 3  # keep many mutated cases valid enough to generate
            body = json.dumps(obj, allow_nan=True).encode("utf-8", "surrogatepass")
        elif kind == "json":
            body = json.dumps(draw(anything), allow_nan=True).encode("utf-8", "surrogatepass")
        elif kind == "bytes":
            body = draw(st.binary(max_size=200))
        elif kind == "nested":
            depth = draw(st.integers(50, 200_000))
            opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
            body = (opener * depth + "1" + closer * depth).encode()
        elif kind == "large":
            size = draw(st.sampled_from([3 * 2**20, 5 * 2**20, 12 * 2**20]))
            word = draw(st.sampled_from(["a", "hello ", "\u00e9"]))
            field_name = "prompt" if path.endswith("/completions") and "chat" not in path else "messages"
            body = LargeBody(field_name, word, size)
        elif kind == "method":
            method = draw(st.sampled_from(["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]))
            path = draw(st.sampled_from(ROUTES))
            if method == "GET" and path in ("/v1/models", "/metrics", "/health"):
                method = "DELETE"
        elif kind == "path":
            path = "/" + draw(st.text(st.characters(min_codepoint=33, max_codepoint=126,
                                                    exclude_characters="?#%"), max_size=30))
            method = draw(st.sampled_from(["GET", "POST"]))
        else:  # "get": the read-only routes, with odd headers and query strings
            method = "GET"
            path = draw(st.sampled_from(ROUTES[2:])) + draw(st.sampled_from(["", "?x=1", "?" + "a" * 3000]))
        return FuzzCase(method, path, body, headers, kind)

    out: list[FuzzCase] = []

    @hseed(seed)
    @settings(max_examples=num_cases, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case())
    def collect(c: FuzzCase) -> None:
        out.append(c)

    collect()
    return out[:num_cases]


# --- sending them ------------------------------------------------------------------------
def _check(client: httpx.Client, case: FuzzCase, report_lists: dict[str, list], timeout: float) -> int | str:
    """Send one case; returns its status (or "hang") and files what went wrong."""
    try:
        body = case.body.build() if isinstance(case.body, LargeBody) else case.body
        with client.stream(case.method, case.path, content=body, headers=case.headers,
                           timeout=timeout) as r:
            raw = b"".join(r.iter_bytes())
            status = r.status_code
            ctype = r.headers.get("content-type", "")
    except httpx.LocalProtocolError:  # the client itself refuses to send it (e.g. an illegal header)
        return "unsendable"
    except (httpx.TimeoutException, httpx.RemoteProtocolError, httpx.ReadError) as e:
        report_lists["hangs"].append(f"{type(e).__name__}: {case.describe()}")
        return "hang"
    if status >= 500:
        report_lists["server_errors"].append(f"{status} {raw[:200]!r}: {case.describe()}")
    elif status >= 400 and case.path.split("?")[0].startswith("/v1/") and case.method != "HEAD":
        try:
            err = json.loads(raw)["error"]
            assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str)
        except Exception:
            report_lists["bad_shapes"].append(f"{status} {raw[:200]!r}: {case.describe()}")
    elif status == 200 and "text/event-stream" in ctype and not raw.rstrip().endswith(b"data: [DONE]"):
        report_lists["broken_streams"].append(f"{raw[-200:]!r}: {case.describe()}")
    return status


def run_cases(base_url: str, cases: list[FuzzCase], api_key: str | None = None, concurrency: int = 4,
              timeout: float = 120.0, progress=None) -> FuzzReport:
    """Send every case (`concurrency` at a time) and check the property."""
    base_url = base_url.rstrip("/").removesuffix("/v1")
    report = FuzzReport()
    lists = {"server_errors": report.server_errors, "bad_shapes": report.bad_shapes, "hangs": report.hangs,
             "broken_streams": report.broken_streams}
    t0 = time.monotonic()
    auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=base_url, headers=auth, limits=httpx.Limits(max_connections=concurrency)) as client:
        def one(case: FuzzCase):
            return case, _check(client, case, lists, timeout)

        with ThreadPoolExecutor(concurrency) as pool:
            for case, status in pool.map(one, cases):
                report.cases += 1
                report.statuses[status] += 1
                report.kinds[case.kind] += 1
                if progress:
                    progress(1)
        report.healthy_after = _healthy(client)
        report.generates_after = _generates(client)
    report.seconds = time.monotonic() - t0
    return report


def _healthy(client: httpx.Client) -> bool:
    try:
        return client.get("/health", timeout=30).status_code == 200
    except httpx.HTTPError:
        return False


def _generates(client: httpx.Client) -> bool:
    try:
        r = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2, "temperature": 0}, timeout=60)
        return r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    except (httpx.HTTPError, ValueError, KeyError):
        return False


def write_tiny_model(path, tokenizer_dir, seed: int = 0, hidden: int = 32, layers: int = 2) -> None:
    """A small random Llama with the vocabulary and tokenizer files of `tokenizer_dir`,
    written as a Hugging Face directory: a server on it validates, tokenizes, batches
    and streams like one on the real model, hundreds of times faster (for fuzzing)."""
    import shutil
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    path, tokenizer_dir = Path(path), Path(tokenizer_dir)
    path.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    for f in tokenizer_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "generation_config")):
            shutil.copy(f, path / f.name)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=4096, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    AutoModelForCausalLM.from_config(cfg).float().save_pretrained(str(path), safe_serialization=True)
