"""The race: one prompt decoded twice at once in the same engine, once plain and
once speculative, streamed side by side.

Both requests are greedy and reach the engine in the same step, so they share every
batched forward: the plain side emits one token per step, the speculative side one
plus the drafts the target accepted. Of the tokens one step emits to the speculative
side, all but the last are accepted drafts (the last is the target's own); the
events mark them. Greedy decoding is exact, so the two texts must be identical; the
closing event says whether they are. On a server without speculation both sides
decode plain.

The body may carry a `cache_salt` (or the request an `X-Cache-Salt` header), as a
completion's may: both sides then use that namespace of the shared state.

Events (server-sent, JSON): `start` {prompt_tokens, speculative}; `tokens` {side,
pieces: [[text, drafted], ...]}; `done` {side, tokens, seconds, tokens_per_s, steps,
accepted, finish_reason}; `verdict` {identical, plain_tokens, spec_tokens}; `error`
{message}.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request

from dspark.engine.engine import QueueFull
from dspark.errors import USER_ERRORS
from dspark.runtime.tokenizer import IncrementalDetokenizer

from .async_engine import EngineUnavailable, RequestStream
from .protocol import APIError, bad_request, parse_chat, parse_json_body
from .responses import EventStream, read_body
from .tenants import OPEN_TENANT, cache_salt

#: output tokens per side when the page does not say, and the most it may ask for
DEFAULT_MAX_TOKENS, MAX_TOKENS = 128, 1024
SIDES = ("plain", "spec")


def _event(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"


def parse_race(body: dict, state) -> tuple[list[int], object]:
    """(prompt ids, greedy sampling params) from {"prompt": str, "max_tokens": int}."""
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise bad_request("'prompt' is required: a non-empty string", "prompt")
    max_tokens = body.get("max_tokens", DEFAULT_MAX_TOKENS)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_TOKENS:
        raise bad_request(f"'max_tokens' must be an integer in 1..{MAX_TOKENS}, got {max_tokens!r}", "max_tokens")
    req = parse_chat({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                      "temperature": 0}, state.model)
    return req.prompt_ids, req.params


class _Side:
    """One side's text and counters, kept by the handler."""

    def __init__(self, name: str, stream: RequestStream, tokenizer) -> None:
        self.name = name
        self.stream = stream
        self.text = IncrementalDetokenizer(tokenizer)
        self.token_ids: list[int] = []
        self.accepted = 0
        self.done_at: float | None = None

    def pieces(self, token_ids: list[int], finished: bool) -> list[list]:
        """Per token its text (possibly empty: half a character waits for the next)
        and whether it was a drafted token the target accepted."""
        out = []
        for j, t in enumerate(token_ids):
            drafted = j < len(token_ids) - 1  # only the last token of a step is the target's own
            self.accepted += drafted
            out.append([self.text.push([t]), drafted])
        self.token_ids.extend(token_ids)
        if finished:
            tail = self.text.push([], True)
            if tail:
                out.append([tail, False])
        return out


async def start_race(request: Request, state):
    raw = await read_body(request, state.config.max_request_bytes)

    def parsed() -> tuple[list[int], object, str | None]:
        body = parse_json_body(raw)
        salt = cache_salt(body, request.headers)
        return *parse_race(body, state), salt

    prompt_ids, params, salt = await asyncio.to_thread(parsed)
    # the race's replies read and fill its caller's namespace, as any request of theirs
    tenant = getattr(request.state, "tenant", OPEN_TENANT)
    namespace = state.tenants.namespace(tenant, salt)
    loop = asyncio.get_running_loop()
    rid = uuid.uuid4().hex[:12]
    streams = [RequestStream(f"race-{side}-{rid}", prompt_ids, params, loop, speculate=(side == "spec"),
                             namespace=namespace, owner=tenant) for side in SIDES]
    try:
        state.async_engine.submit(*streams)
        for s in streams:
            await s.accepted
    except EngineUnavailable as e:
        raise APIError(503, str(e), "service_unavailable") from None
    except QueueFull as e:
        _abort(state, streams)
        raise APIError(429, f"{e}; retry later", "rate_limit_error", None, "queue_full") from None
    except USER_ERRORS as e:
        _abort(state, streams)
        raise bad_request(str(e)) from None
    except asyncio.CancelledError:
        _abort(state, streams)
        raise
    sides = [_Side(name, s, state.model.tokenizer) for name, s in zip(SIDES, streams)]
    return EventStream(_race_events(state, sides, len(prompt_ids)), lambda: _abort(state, streams))


def _abort(state, streams: list[RequestStream]) -> None:
    for s in streams:
        if not s.finished:
            state.async_engine.abort(s.request_id)


async def _race_events(state, sides: list[_Side], prompt_tokens: int) -> AsyncIterator[str]:
    start = time.monotonic()
    yield _event({"type": "start", "prompt_tokens": prompt_tokens,
                  "speculative": state.engine.runner.drafter is not None})
    merged: asyncio.Queue = asyncio.Queue()

    async def relay(side: _Side) -> None:
        async for out in side.stream:
            await merged.put((side, out))

    tasks = [asyncio.create_task(relay(side)) for side in sides]
    try:
        remaining = len(sides)
        while remaining:
            side, out = await merged.get()
            if out.error is not None:
                yield _event({"type": "error", "message": out.error})
                return
            pieces = side.pieces(out.token_ids, out.finished)
            if pieces:
                yield _event({"type": "tokens", "side": side.name, "pieces": pieces})
            if out.finished:
                remaining -= 1
                side.done_at = time.monotonic()
                seconds = side.done_at - start
                seq = side.stream.seq
                yield _event({"type": "done", "side": side.name, "tokens": len(side.token_ids),
                              "seconds": round(seconds, 3), "tokens_per_s": round(len(side.token_ids) / seconds, 2),
                              "steps": seq.num_steps if seq is not None else None, "accepted": side.accepted,
                              "finish_reason": out.finish_reason})
        plain, spec = sides
        yield _event({"type": "verdict", "identical": plain.token_ids == spec.token_ids,
                      "plain_tokens": len(plain.token_ids), "spec_tokens": len(spec.token_ids),
                      "speedup": round((plain.done_at - start) / max(spec.done_at - start, 1e-9), 3)})
    finally:
        for t in tasks:
            t.cancel()
