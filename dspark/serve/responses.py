"""OpenAI response bodies for chat and text completions, whole and streamed, and the
request and response helpers every route shares (the body read under a size limit,
server-sent events that clean up however they end)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from .protocol import APIError


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def sse(obj: dict | str) -> str:
    """One server-sent event; `obj` is a JSON body or the literal `[DONE]`."""
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n"


@dataclass
class Reply:
    """Builds the bodies of one response. `chat` selects chat.completion(.chunk)
    over text_completion."""

    chat: bool
    model: str
    include_usage: bool = False
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finish_reason}
            body = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            body = self._head("text_completion")
        return {**body, "choices": [choice], "usage": usage(prompt_tokens, completion_tokens)}

    def chunk(self, text: str, finish_reason: str | None = None, role: bool = False) -> dict:
        if self.chat:
            delta: dict = {"role": "assistant", "content": text} if role else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            body = self._head("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            body = self._head("text_completion")
        body["choices"] = [choice]
        if self.include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        body = self._head("chat.completion.chunk" if self.chat else "text_completion")
        return {**body, "choices": [], "usage": usage(prompt_tokens, completion_tokens)}


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 once it is over `limit` bytes (by its declared
    length before reading, else while reading)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is over the server's limit of {limit} bytes (--max-request-bytes)",
                    "invalid_request_error", None, "request_too_large")


class EventStream(StreamingResponse):
    """Server-sent events that abort their request however the response ends,
    even when the client leaves before the first event (the body generator, never
    started, would run no cleanup of its own)."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()
