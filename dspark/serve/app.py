"""The OpenAI-compatible HTTP API.

Routes: POST /v1/chat/completions and /v1/completions (whole or streamed as
server-sent events), GET /v1/models, /health and /metrics (Prometheus text); the
live view (`/` and `/race`, with their data under `/dashboard/`) is `dashboard.py`'s.
Handlers only validate, tokenize and relay: the engine runs in `AsyncEngine`'s
thread. A client that disconnects has its request aborted, which frees its KV
slot before the next step. Every error, including unknown routes, has OpenAI's
`{"error": {...}}` shape.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dspark.engine.engine import LLMEngine, QueueFull
from dspark.errors import USER_ERRORS
from dspark.runtime.tokenizer import IncrementalDetokenizer

from .async_engine import AsyncEngine, EngineUnavailable, RequestStream
from .config import ServeConfig, build_engine, default_served_name
from .dashboard import add_live_routes
from .metrics import ServingMetrics
from .protocol import APIError, GenerationRequest, ModelContext, bad_request, parse_chat, parse_completion, \
    parse_json_body
from .responses import EventStream, Reply, read_body, sse
from .stream_groups import TokenGroups
from .tenants import OPEN_TENANT, cache_salt

log = logging.getLogger("dspark.serve")

#: how often a non-streamed request checks whether its client is still there
DISCONNECT_POLL_S = 0.5


#: how often a request that arrived during start-up looks whether the engine is ready
READY_POLL_S = 0.05

#: the phases /health reports before the engine is ready
STARTING, LOADING, PROFILING, READY, FAILED = "starting", "loading", "profiling", "ready", "failed"
PHASE_MESSAGES = {STARTING: "the server is starting", LOADING: "the server is loading the model",
                  PROFILING: "the server is loading the drafter and measuring step times",
                  FAILED: "the engine failed to start"}


class ServerState:
    """What the routes share. The engine may come later than the app: `dspark serve`
    answers /health (503, with the phase in its body) and /metrics from its first
    second, while the model loads and the step-time profile runs; a generation route
    called before `attach` has run waits for it up to `config.ready_wait` seconds, then
    answers 503 with Retry-After (at once if the build failed)."""

    def __init__(self, config: ServeConfig, names: list[str]) -> None:
        self.config = config
        self.tenants = config.tenants
        self.metrics = ServingMetrics(names[0])
        self.names = names
        self.phase = STARTING
        self.started = time.monotonic()
        self.engine: LLMEngine | None = None
        self.async_engine: AsyncEngine | None = None
        self.model: ModelContext | None = None
        t = self.tenants
        log.info("API keys: %s; /metrics %s", f"{len(t.keys)} for {len(t.tenants)} tenant(s), namespaces "
                 f"{'shared unless a request sends a cache_salt' if t.shared else 'per tenant'}" if t.required
                 else "none (anyone may call the API)",
                 "is public (--metrics-public)" if self.metrics_public else "needs a key" if t.required
                 else "is open, as the API is")

    @property
    def metrics_public(self) -> bool:
        return self.config.metrics_public or not self.tenants.required

    @property
    def ready(self) -> bool:
        return self.phase == READY

    def set_phase(self, phase: str) -> None:
        log.info("%s (%.1f s since start)", PHASE_MESSAGES.get(phase, phase), time.monotonic() - self.started)
        self.phase = phase

    def attach(self, engine: LLMEngine) -> None:
        """The engine is built: the routes may use it from now on."""
        self.engine = engine
        self.async_engine = AsyncEngine(engine, self.metrics, self.config.log_interval)
        self.model = ModelContext(self.names, engine.target.tokenizer, engine.config.max_model_len,
                                  engine.target.cfg.vocab_size)
        self.phase = READY
        log.info("ready after %.1f s: serving %s, max %d running and %d waiting requests of up to %d tokens, "
                 "API key %s", time.monotonic() - self.started, " / ".join(self.names),
                 engine.config.max_num_seqs, engine.config.max_waiting, engine.config.max_model_len,
                 "required" if self.tenants.required else "not required")

    def build(self) -> None:
        """Build the engine from the config on the calling thread (which then owns
        torch's thread pool), reporting the phases; FAILED if it raises."""
        try:
            engine = build_engine(self.config, on_phase=self.set_phase)
        except BaseException:
            self.phase = FAILED
            raise
        self.attach(engine)

    async def wait_ready(self) -> None:
        """Return once the engine is ready, or after `config.ready_wait` seconds of start-up,
        or at once if the build failed; `require_ready` then says which."""
        deadline = time.monotonic() + self.config.ready_wait
        while self.phase in (STARTING, LOADING, PROFILING) and time.monotonic() < deadline:
            await asyncio.sleep(min(READY_POLL_S, max(0.0, deadline - time.monotonic())))

    def require_ready(self) -> None:
        if not self.ready:
            waited = time.monotonic() - self.started
            raise APIError(503, f"{PHASE_MESSAGES.get(self.phase, self.phase)} ({waited:.0f} s so far); "
                                "retry shortly", "service_unavailable", None, self.phase)

    def health(self) -> tuple[int, dict]:
        if self.ready:
            if self.async_engine.alive:
                return 200, {"status": "ok"}
            return 503, {"status": "stopped", "message": "the engine is not running"}
        return 503, {"status": self.phase, "message": PHASE_MESSAGES.get(self.phase, self.phase),
                     "seconds": round(time.monotonic() - self.started, 1)}


def create_app(engine_or_config: LLMEngine | ServeConfig, config: ServeConfig | None = None,
               build: bool = True) -> FastAPI:
    """The app for a built engine (with HTTP options from `config`) or for a
    `ServeConfig`: the engine is built from it now, or with `build=False` later by
    `state.build()` (what `run_server` does, so that /health answers during start-up).
    The engine loop starts with the app's lifespan on a thread of its own, unless
    `run_server` runs it on the main thread, and stops with the lifespan;
    `app.state.dspark` is the `ServerState`."""
    if isinstance(engine_or_config, ServeConfig):
        config, engine = engine_or_config, None
    else:
        engine = engine_or_config
        config = config or ServeConfig(speculative=None)
    names = config.served_model_names or [default_served_name(engine.target.name if engine else config.model)]
    state = ServerState(config, names)
    if engine is not None:
        state.attach(engine)
    elif build:
        state.build()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if state.async_engine is not None:
            state.async_engine.start()
        yield
        if state.async_engine is not None:
            await asyncio.to_thread(state.async_engine.shutdown)

    app = FastAPI(title="dspark", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.dspark = state
    _add_error_handlers(app)

    async def require_api_key(request: Request) -> None:
        """The caller's tenant into `request.state.tenant`, or a 401."""
        request.state.tenant = state.tenants.authenticate(request.headers.get("authorization", ""))

    async def metrics_key(request: Request) -> None:
        if not state.metrics_public:
            await require_api_key(request)

    started = int(time.time())

    async def require_ready() -> None:
        await state.wait_ready()
        state.require_ready()

    auth = [Depends(require_api_key), Depends(require_ready)]

    @app.post("/v1/chat/completions", dependencies=auth)
    async def chat_completions(request: Request):
        return await _generate(request, state, parse_chat, chat=True)

    @app.post("/v1/completions", dependencies=auth)
    async def completions(request: Request):
        return await _generate(request, state, parse_completion, chat=False)

    @app.get("/v1/models", dependencies=auth)
    async def models() -> dict:
        engine = state.engine
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": started, "owned_by": "dspark",
             "root": str(engine.target.path), "max_model_len": engine.config.max_model_len} for name in names]}

    @app.get("/health")
    async def health() -> JSONResponse:
        status, body = state.health()
        return JSONResponse(body, status_code=status, headers=None if status == 200 else {"Retry-After": "1"})

    @app.get("/metrics", dependencies=[Depends(metrics_key)])
    async def prometheus_metrics() -> PlainTextResponse:
        return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    add_live_routes(app, state, require_api_key)

    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        headers = {"Retry-After": "1"} if e.status in (429, 503) else None
        return JSONResponse(e.body(), status_code=e.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        if e.status_code == 404:
            err = APIError(404, f"Invalid URL ({request.method} {request.url.path})", code="unknown_url")
        elif e.status_code == 405:
            err = APIError(405, f"method {request.method} is not allowed on {request.url.path}",
                           code="method_not_allowed")
        else:
            err = APIError(e.status_code, str(e.detail))
        return JSONResponse(err.body(), status_code=err.status, headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        err = APIError(500, f"internal server error: {type(e).__name__}", "server_error")
        return JSONResponse(err.body(), status_code=500)


async def _generate(request: Request, state: ServerState,
                    parse: Callable[[dict, ModelContext], GenerationRequest], chat: bool):
    raw = await read_body(request, state.config.max_request_bytes)

    def parsed() -> tuple[GenerationRequest, str | None]:
        body = parse_json_body(raw)
        salt = cache_salt(body, request.headers)
        return parse(body, state.model), salt

    # JSON parsing and tokenization off the event loop: a large prompt takes CPU time
    # during which every other connection would otherwise wait
    req, salt = await asyncio.to_thread(parsed)
    tenant = getattr(request.state, "tenant", OPEN_TENANT)
    reply = Reply(chat=chat, model=req.model, include_usage=req.include_usage)
    stream = RequestStream(reply.id, req.prompt_ids, req.params, asyncio.get_running_loop(),
                           namespace=state.tenants.namespace(tenant, salt), owner=tenant)
    try:
        state.async_engine.submit(stream)
        await stream.accepted
    except asyncio.CancelledError:
        _abort_unfinished(state, stream)
        raise
    except QueueFull as e:
        raise APIError(429, f"{e}; retry later", "rate_limit_error", None, "queue_full") from None
    except EngineUnavailable as e:
        raise APIError(503, str(e), "service_unavailable") from None
    except USER_ERRORS as e:
        raise bad_request(str(e)) from None
    if req.stream:
        return EventStream(_stream(state, stream, req, reply), lambda: _abort_unfinished(state, stream))
    return await _whole(request, state, stream, req, reply)


def _abort_unfinished(state: ServerState, stream: RequestStream) -> None:
    if not stream.finished:
        state.async_engine.abort(stream.request_id)


async def _stream(state: ServerState, stream: RequestStream, req: GenerationRequest,
                  reply: Reply) -> AsyncIterator[str]:
    text = IncrementalDetokenizer(state.model.tokenizer, req.params.stop)
    groups = TokenGroups(state.config.stream_chunk_tokens)
    num_out = 0
    try:
        if reply.chat:
            yield sse(reply.chunk("", role=True))
        async for out in stream:
            if out.error is not None:
                yield sse(APIError(500, out.error, "server_error").body())
                break
            num_out += len(out.token_ids)
            chunks = groups.push(out.token_ids, out.finished)
            for i, token_ids in enumerate(chunks):
                last = out.finished and i == len(chunks) - 1
                delta = text.push(token_ids, last)
                if last:
                    yield sse(reply.chunk(delta, "stop" if text.hit_stop else out.finish_reason))
                    if reply.include_usage:
                        yield sse(reply.usage_chunk(len(req.prompt_ids), num_out))
                elif delta:
                    yield sse(reply.chunk(delta))
        yield sse("[DONE]")
    finally:  # also on cancellation: the client went away
        _abort_unfinished(state, stream)


async def _whole(request: Request, state: ServerState, stream: RequestStream, req: GenerationRequest,
                 reply: Reply) -> JSONResponse:
    text = IncrementalDetokenizer(state.model.tokenizer, req.params.stop)
    num_out = 0
    loop = asyncio.get_running_loop()
    checked = loop.time()
    try:
        while True:
            out = await stream.get(DISCONNECT_POLL_S)
            if loop.time() - checked >= DISCONNECT_POLL_S:
                checked = loop.time()
                if await request.is_disconnected():
                    return JSONResponse({}, status_code=499)  # nobody reads it
            if out is None:
                continue
            num_out += len(out.token_ids)
            text.push(out.token_ids, out.finished)
            if out.finished:
                break
    finally:
        _abort_unfinished(state, stream)
    if out.error is not None:
        raise APIError(500, out.error, "server_error")
    reason = "stop" if text.hit_stop else out.finish_reason
    return JSONResponse(reply.full(text.text, reason, len(req.prompt_ids), num_out))
