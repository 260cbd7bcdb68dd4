"""A small client for OpenAI-compatible `/v1/chat/completions` servers (vLLM, SGLang,
our own `dspark serve`), for regenerating responses at scale.

Calls are blocking and thread-safe; the caller runs a few at once from a thread pool.
Transport errors, 408, 429 and 5xx are retried with exponential backoff; any other
error status stops the run with the server's message.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from ..sampling import SamplingParams
from .sources import DataError

RETRY_STATUS = {408, 429, 500, 502, 503, 504}


class ServerError(DataError):
    pass


@dataclass
class ChatReply:
    text: str
    finish_reason: str
    completion_tokens: int | None  # as the server counts them, if it says


def api_base(url: str) -> str:
    """`http://host:8000`, `.../v1` or `.../v1/chat/completions` -> `http://host:8000/v1`."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise DataError(f"server URL {url!r} must start with http:// or https://")
    for suffix in ("/chat/completions", "/completions"):
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    return url if url.endswith("/v1") else url + "/v1"


class ChatClient:
    def __init__(
        self,
        url: str,
        model: str | None = None,
        timeout_s: float = 600.0,
        max_retries: int = 5,
        backoff_s: float = 1.0,
        api_key: str | None = None,
    ) -> None:
        self.base = api_base(url)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(timeout=timeout_s, headers=headers)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.model = model or self._only_model()

    def close(self) -> None:
        self._http.close()

    def complete(self, messages: list[dict], params: SamplingParams) -> ChatReply:
        body: dict = {
            "model": self.model,
            "messages": messages,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "n": 1,
            "stream": False,
        }
        if params.top_k > 0:
            body["top_k"] = params.top_k  # vLLM/SGLang extension; --top-k 0 leaves it out
        if params.seed is not None:
            body["seed"] = params.seed
        if params.stop:
            body["stop"] = params.stop
        data = self._request("POST", "/chat/completions", body)
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
            finish = choice.get("finish_reason") or "stop"
        except (KeyError, IndexError, TypeError, AttributeError):
            raise ServerError(f"{self.base}/chat/completions returned no choice: {str(data)[:300]}") from None
        usage = data.get("usage") or {}
        return ChatReply(text, finish, usage.get("completion_tokens"))

    def _only_model(self) -> str:
        data = self._request("GET", "/models")
        names = [m.get("id") for m in data.get("data", []) if isinstance(m, dict) and m.get("id")]
        if len(names) != 1:
            raise DataError(
                f"{self.base}/models lists {len(names)} models ({', '.join(names) or 'none'}); "
                "name the one to use with --served-model"
            )
        return names[0]

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        url = self.base + path
        for attempt in range(self.max_retries + 1):
            last_try = attempt == self.max_retries
            try:
                resp = self._http.request(method, url, json=body)
            except httpx.TransportError as e:
                if last_try:
                    raise ServerError(f"cannot reach {url} after {attempt + 1} tries: {e}") from None
            else:
                if resp.status_code == 200:
                    try:
                        return resp.json()
                    except ValueError:
                        raise ServerError(f"{url} returned a body that is not JSON: {resp.text[:300]}") from None
                if resp.status_code not in RETRY_STATUS or last_try:
                    raise ServerError(f"{url} answered {resp.status_code}: {resp.text[:300]}")
            time.sleep(min(30.0, self.backoff_s * 2**attempt))
        raise AssertionError("unreachable")
