"""OpenAI request bodies -> validated generation requests, and OpenAI-shaped errors.

Validation is explicit rather than schema-driven so that every mistake gets a
message naming the field and what it accepts, and the error body has OpenAI's
shape: `{"error": {"message", "type", "param", "code"}}`. Unknown keys are ignored
(clients send many optional ones); known features this server does not implement
are accepted only at their neutral value and rejected otherwise, so a request
never silently means something other than what the client asked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from dspark.runtime.tokenizer import Tokenizer
from dspark.sampling import SamplingError, SamplingParams

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
CHAT_ROLES = ("system", "user", "assistant", "developer")

# key -> values that mean "feature not used"
UNSUPPORTED_NEUTRAL: dict[str, tuple] = {
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "logit_bias": (None, {}),
    "suffix": (None, ""),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none", "auto"),
    "response_format": (None, {"type": "text"}),
    "min_tokens": (None, 0),
}


class APIError(Exception):
    """An error returned to the client as `{"error": {...}}` with an HTTP status."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


@dataclass
class ModelContext:
    """What validation needs to know about the served model."""

    names: list[str]
    tokenizer: Tokenizer
    max_model_len: int
    vocab_size: int
    _max_token_chars: int | None = None

    def check_text_length(self, chars: int, param: str) -> None:
        """Refuse, without tokenizing, a prompt text too long to fit whatever its tokens:
        tokenizing megabytes takes seconds of CPU that running requests need."""
        if self._max_token_chars is None:
            tok = self.tokenizer.tok
            pieces = tok.convert_ids_to_tokens(list(range(len(tok))))
            self._max_token_chars = max(1, max(len(tok.convert_tokens_to_string([p])) for p in pieces if p))
        limit = self._max_token_chars * self.max_model_len
        if chars > limit:
            raise bad_request(
                f"the prompt has {chars} characters, more than this model's maximum context length of "
                f"{self.max_model_len} tokens can hold (at most {self._max_token_chars} characters per token); "
                "shorten the prompt", param, "context_length_exceeded")


@dataclass
class GenerationRequest:
    model: str
    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool


def parse_json_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    _check_unicode(body)
    return body


def _check_unicode(body: dict) -> None:
    """Refuse strings that are not Unicode text: JSON's escapes can spell lone UTF-16
    surrogates ("\\ud800"), which no tokenizer can encode."""
    stack: list[object] = [body]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, str):
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                raise bad_request(f"the request contains a string that is not valid Unicode (a lone surrogate): "
                                  f"{x[:40].encode('utf-8', 'backslashreplace').decode()!r}") from None


# --- typed field access -------------------------------------------------------------
def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _int(body: dict, key: str, default: int | None, lo: int | None = None, hi: int | None = None) -> int | None:
    x = body.get(key)
    if x is None:
        return default
    if not _is_int(x):
        raise bad_request(f"'{key}' must be an integer, got {json.dumps(x)}", key)
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        bounds = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise bad_request(f"'{key}' must be {bounds}, got {x}", key)
    return x


def _float(body: dict, key: str, default: float) -> float:
    x = body.get(key)
    if x is None:
        return default
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        raise bad_request(f"'{key}' must be a number, got {json.dumps(x)}", key)
    return float(x)


def _bool(body: dict, key: str, default: bool) -> bool:
    x = body.get(key)
    if x is None:
        return default
    if not isinstance(x, bool):
        raise bad_request(f"'{key}' must be true or false, got {json.dumps(x)}", key)
    return x


def _stop(body: dict) -> list[str]:
    x = body.get("stop")
    if x is None:
        return []
    if isinstance(x, str):
        x = [x]
    if not isinstance(x, list) or not all(isinstance(s, str) for s in x):
        raise bad_request("'stop' must be a string or a list of strings", "stop")
    return [s for s in x if s]


# --- shared fields -------------------------------------------------------------------
def _common(body: dict, ctx: ModelContext) -> tuple[str, bool, bool]:
    model = body.get("model")
    if model is None:
        model = ctx.names[0]
    if not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    if model not in ctx.names:
        raise bad_request(f"the model '{model}' does not exist; this server serves {', '.join(ctx.names)} "
                          "(see GET /v1/models)", "model", "model_not_found")
    n = _int(body, "n", 1)
    if n != 1:
        raise bad_request(f"only n=1 is supported, got n={n}; send separate requests for more choices", "n")
    for key, neutral in UNSUPPORTED_NEUTRAL.items():
        if key in body and body[key] not in neutral:
            raise bad_request(f"'{key}' is not supported by this server; omit it", key)
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
        if not isinstance(options, dict):
            raise bad_request("'stream_options' must be an object", "stream_options")
        include_usage = _bool(options, "include_usage", False)
    return model, stream, include_usage


def _sampling(body: dict, ctx: ModelContext, num_prompt: int) -> SamplingParams:
    if num_prompt >= ctx.max_model_len:
        raise bad_request(
            f"the prompt has {num_prompt} tokens, but this model's maximum context length is "
            f"{ctx.max_model_len} tokens (prompt and output together); shorten the prompt",
            "messages" if "messages" in body else "prompt", "context_length_exceeded")
    room = ctx.max_model_len - num_prompt
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, key, None, lo=1)
    if max_tokens is None:
        max_tokens = room
    elif max_tokens > room:
        raise bad_request(
            f"this model's maximum context length is {ctx.max_model_len} tokens, but {num_prompt + max_tokens} "
            f"were requested ({num_prompt} in the prompt, {max_tokens} in the output); lower '{key}'",
            key, "context_length_exceeded")
    temperature = _float(body, "temperature", 1.0)
    if not 0 <= temperature <= 2:
        raise bad_request(f"'temperature' must be in [0, 2], got {temperature}", "temperature")
    top_p = _float(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise bad_request(f"'top_p' must be in (0, 1], got {top_p}", "top_p")
    top_k = _int(body, "top_k", 0, lo=-1)  # -1 and 0 both mean "off"
    seed = _int(body, "seed", None, INT64_MIN, INT64_MAX)
    try:
        return SamplingParams(temperature=temperature, top_p=top_p, top_k=max(top_k, 0), max_tokens=max_tokens,
                              seed=seed, stop=_stop(body), ignore_eos=_bool(body, "ignore_eos", False))
    except SamplingError as e:
        raise bad_request(str(e)) from None


# --- the two endpoints -----------------------------------------------------------------
def _message_text(content: object, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(f"messages[{i}].content: only text parts ({{\"type\": \"text\", \"text\": ...}}) "
                                  "are supported", "messages")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_request(f"messages[{i}].content must be a string or a list of text parts", "messages")


def parse_chat(body: dict, ctx: ModelContext) -> GenerationRequest:
    model, stream, include_usage = _common(body, ctx)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' is required: a non-empty list of {\"role\", \"content\"} objects", "messages")
    chat = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object with 'role' and 'content'", "messages")
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise bad_request(f"messages[{i}].role must be one of {', '.join(CHAT_ROLES)}, got {json.dumps(role)}",
                              "messages")
        content = "" if m.get("content") is None and role == "assistant" else _message_text(m.get("content"), i)
        chat.append({"role": "system" if role == "developer" else role, "content": content})
    ctx.check_text_length(sum(len(m["content"]) for m in chat), "messages")
    try:
        prompt_ids = ctx.tokenizer.apply_chat_template(chat)
    except Exception as e:  # the model's template rejects the conversation (e.g. role order)
        raise bad_request(f"the model's chat template rejected these messages: {e}", "messages") from None
    return GenerationRequest(model, prompt_ids, _sampling(body, ctx, len(prompt_ids)), stream, include_usage)


def parse_completion(body: dict, ctx: ModelContext) -> GenerationRequest:
    model, stream, include_usage = _common(body, ctx)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        # Like a raw Hugging Face call: special tokens (e.g. BOS) as the tokenizer adds them.
        ctx.check_text_length(len(prompt), "prompt")
        prompt_ids = list(ctx.tokenizer.tok.encode(prompt, add_special_tokens=True))
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < ctx.vocab_size]
        if bad:
            raise bad_request(f"token ids must be in [0, {ctx.vocab_size}), got {bad[:5]}", "prompt")
        prompt_ids = list(prompt)
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise bad_request("only one prompt per request is supported; send one request per prompt", "prompt")
    else:
        raise bad_request("'prompt' is required: a string or a list of token ids", "prompt")
    if not prompt_ids:
        raise bad_request("the prompt is empty", "prompt")
    return GenerationRequest(model, prompt_ids, _sampling(body, ctx, len(prompt_ids)), stream, include_usage)
