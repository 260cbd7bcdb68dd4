"""One streamed request to an OpenAI-compatible server, timed chunk by chunk.

The request asks for `stream_options.include_usage`, so the last event carries the
server's own `completion_tokens`; that is the output token count. A server that
sends no usage gets its text chunks counted instead (one token per chunk, which
undercounts a speculative server) and the result says so (`tokens_from_usage`).
A chunk "carries text" when it has non-empty `choices[0].text` (completions) or
`choices[0].delta.content` (chat; `reasoning_content`/`reasoning` count too).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx

from .dataset import BenchPrompt

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass
class RequestResult:
    success: bool = False
    error: str | None = None
    start: float = 0.0  # time.perf_counter() when sent
    end: float = 0.0
    ttft: float | None = None  # seconds from start to the first text chunk
    itls: list[float] = field(default_factory=list)  # seconds between consecutive text chunks
    text_chunks: int = 0
    output_tokens: int = 0
    prompt_tokens: int | None = None
    tokens_from_usage: bool = False

    @property
    def e2el(self) -> float:
        return self.end - self.start


def request_body(prompt: BenchPrompt, endpoint: str, model: str, max_tokens: int, temperature: float,
                 ignore_eos: bool, extra_body: dict | None = None) -> dict:
    body: dict = {"model": model, "max_tokens": prompt.max_tokens or max_tokens, "temperature": temperature,
                  "stream": True, "stream_options": {"include_usage": True}}
    if endpoint == "chat":
        body["messages"] = prompt.chat_messages()
    else:
        body["prompt"] = prompt.completion_prompt()
    if ignore_eos:
        body["ignore_eos"] = True  # an extension field (vLLM, SGLang, dspark); strict servers reject it
    body.update(extra_body or {})
    return body


def _chunk_text(chunk: dict) -> str:
    choices = chunk.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return "".join(delta.get(k) or "" for k in ("content", "reasoning_content", "reasoning")
                       if isinstance(delta.get(k), str))
    text = choice.get("text")
    return text if isinstance(text, str) else ""


def _error_text(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").strip()
    try:
        err = json.loads(text)
        msg = err["error"]["message"] if isinstance(err.get("error"), dict) else err.get("error") or err["detail"]
        return str(msg)
    except (ValueError, KeyError, TypeError, AttributeError):
        return text[:300] or "(empty body)"


async def stream_request(client: httpx.AsyncClient, url: str, body: dict, headers: dict[str, str]) -> RequestResult:
    """POST `body` to `url` and read its server-sent events to the end."""
    res = RequestResult(start=time.perf_counter())
    usage_tokens: int | None = None
    finished = False
    last = res.start
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {_error_text(await r.aread())}"
                return res
            async for line in r.aiter_lines():
                now = time.perf_counter()
                if not line.startswith("data:"):
                    continue  # blank separators, comments, event names
                data = line[5:].strip()
                if data == "[DONE]":
                    finished = True
                    break
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    res.error = f"the server sent an event that is not JSON: {data[:200]!r}"
                    return res
                if not isinstance(chunk, dict):
                    continue
                if chunk.get("error"):
                    err = chunk["error"]
                    res.error = f"error event: {err.get('message', err) if isinstance(err, dict) else err}"
                    return res
                usage = chunk.get("usage")
                if isinstance(usage, dict):
                    if isinstance(usage.get("completion_tokens"), int):
                        usage_tokens = usage["completion_tokens"]
                    if isinstance(usage.get("prompt_tokens"), int):
                        res.prompt_tokens = usage["prompt_tokens"]
                choices = chunk.get("choices") or []
                if choices and isinstance(choices[0], dict) and choices[0].get("finish_reason"):
                    finished = True
                if _chunk_text(chunk):
                    if res.ttft is None:
                        res.ttft = now - res.start
                    else:
                        res.itls.append(now - last)
                    last = now
                    res.text_chunks += 1
    except httpx.HTTPError as e:
        res.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        return res
    finally:
        res.end = time.perf_counter()
    if not finished:
        res.error = "the stream ended without a finish_reason or [DONE]"
        return res
    res.tokens_from_usage = usage_tokens is not None
    res.output_tokens = usage_tokens if usage_tokens is not None else res.text_chunks
    if res.ttft is None:  # no text at all (e.g. an immediate end of sequence)
        res.ttft = res.e2el
    res.success = True
    return res
