"""The engine on one thread, fed by asyncio handlers.

`LLMEngine` is single-threaded; exactly one thread owns it: a background thread
(`start`, for tests and in-process servers) or the process's main thread
(`run_foreground`, what `dspark serve` does: on CPU, torch's OpenMP pool belongs to
the thread that first ran a parallel region, and a forward from any other thread
runs 1.5-1.8x slower). Handlers
submit a `RequestStream` and abort by request id through a lock-protected inbox;
the thread applies both between steps, so an abort frees the request's KV slot
before the next forward. It loops `step()` while there is work and sleeps on a
condition when idle. Outputs go back to each request's asyncio queue through
`loop.call_soon_threadsafe`, the only safe way to wake an event loop from another
thread.

Fault containment: a request the engine refuses (queue full, prompt too long)
fails its own `accepted` future; a step that raises fails the requests of that
step with an explicit error (one batched forward cannot tell which request broke
it) and the thread goes on with the rest. Nothing a request does ends the thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field

from dspark.engine.engine import LLMEngine
from dspark.engine.sequence import Sequence
from dspark.sampling import SamplingParams

from .metrics import ServingMetrics, stats_delta

log = logging.getLogger("dspark.serve")


class EngineUnavailable(RuntimeError):
    """The engine thread is stopping or has stopped; the request was not taken."""


@dataclass
class RequestOutput:
    """What one step emitted for one request."""

    token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    error: str | None = None


@dataclass(eq=False)
class RequestStream:
    """One request as a handler sees it: submit it, await `accepted`, then iterate
    its outputs until one is `finished`."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    arrival: float = field(default_factory=time.monotonic)
    finished: bool = False
    speculate: bool = True  # False: decoded without drafts (the race's plain side)
    #: the namespace of the shared state it may use, and its tenant (dspark.serve.tenants)
    namespace: str | None = None
    owner: str | None = None
    # engine-thread bookkeeping
    seq: Sequence | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None

    def __post_init__(self) -> None:
        self.accepted: asyncio.Future[None] = self.loop.create_future()
        self._queue: asyncio.Queue[RequestOutput] = asyncio.Queue()

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        out = await self._queue.get()
        self.finished = out.finished
        return out

    async def get(self, timeout: float) -> RequestOutput | None:
        """The next output, or None when none came within `timeout` seconds."""
        try:
            out = await asyncio.wait_for(self._queue.get(), timeout)
        except asyncio.TimeoutError:
            return None
        self.finished = out.finished
        return out

    # --- called from the engine thread --------------------------------------------
    def _call(self, fn, *args) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    def _settle(self, error: BaseException | None) -> None:
        def settle() -> None:
            if self.accepted.done():
                return
            if error is None:
                self.accepted.set_result(None)
            else:
                self.accepted.set_exception(error)

        self._call(settle)

    def _push(self, out: RequestOutput) -> None:
        self._call(self._queue.put_nowait, out)


class AsyncEngine:
    def __init__(self, engine: LLMEngine, metrics: ServingMetrics, log_interval: float = 10.0) -> None:
        self.engine = engine
        self.metrics = metrics
        self.log_interval = log_interval
        self._cond = threading.Condition()
        self._inbox: list[RequestStream] = []
        self._aborts: list[str] = []
        self._stopping = False
        self._streams: dict[str, RequestStream] = {}  # owned by the engine thread
        self._stats = engine.total_stats()
        self._last_log = time.monotonic()
        self._thread: threading.Thread | None = None
        self._foreground = False  # run_foreground owns the loop; start() does nothing
        self._done = threading.Event()

    # --- handler side ------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None or self._foreground:
            return
        # A daemon, so that a forced exit (second Ctrl-C) never hangs on it.
        self._thread = threading.Thread(target=self._run, name="dspark-engine", daemon=True)
        self._thread.start()

    def claim_foreground(self) -> None:
        """Mark the calling thread as the engine's owner before the app starts, so the
        lifespan does not spawn a thread; then call `run_foreground` on it."""
        self._foreground = True
        self._thread = threading.current_thread()

    def run_foreground(self, keep_running=lambda: True) -> None:
        """The engine loop on the calling thread, until `shutdown` or until
        `keep_running()` turns false (checked at least every half second)."""
        if not self._foreground:
            self.claim_foreground()
        self._run(keep_running)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def submit(self, *streams: RequestStream) -> None:
        """Queue requests; several given together reach the engine in the same step."""
        with self._cond:
            if not self.alive:
                raise EngineUnavailable("the server is shutting down" if self._stopping else
                                        "the engine is not running")
            self._inbox.extend(streams)
            self._cond.notify()

    def abort(self, request_id: str) -> None:
        with self._cond:
            self._aborts.append(request_id)
            self._cond.notify()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Fail whatever is still queued or running, then stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._done.wait(timeout)

    # --- engine thread -------------------------------------------------------------
    def _run(self, keep_running=lambda: True) -> None:
        try:
            self._loop(keep_running)
        finally:
            self._done.set()

    def _loop(self, keep_running) -> None:
        log.info("engine loop started on thread %s", threading.current_thread().name)
        while True:
            with self._cond:
                if not keep_running():
                    self._stopping = True
                if not (self._inbox or self._aborts or self._stopping or self.engine.has_unfinished()):
                    wait = self._until_next_log()  # None: no log due; wake at least every 0.5 s for keep_running
                    self._cond.wait(timeout=0.5 if wait is None else min(wait, 0.5))
                inbox, self._inbox = self._inbox, []
                aborts, self._aborts = self._aborts, []
                stopping = self._stopping
            try:
                if stopping:
                    self._fail_all(inbox, "the server is shutting down")
                    self._publish_load()
                    if self.log_interval > 0:
                        self._log_window(time.monotonic())  # the last window, however short
                    break
                self._iterate(inbox, aborts)
                self._publish_load()
                self._maybe_log()
            except Exception as e:  # a bug in this loop itself: fail everything, keep serving
                log.exception("engine loop error; failing every request in flight")
                self._fail_all(inbox, f"internal error: {type(e).__name__}: {e}")
        log.info("engine loop stopped")

    def _iterate(self, inbox: list[RequestStream], aborts: list[str]) -> None:
        # New requests first, so an abort that raced its own submission still finds it.
        refused = [self._add(stream) for stream in inbox]
        for rid in aborts:
            if self.engine.abort(rid):
                self._finish(rid, RequestOutput([], True, "abort"))
        # Gauges before answers: a client that has its answer sees itself counted.
        self._publish_load()
        for stream, error in zip(inbox, refused):
            stream._settle(error)
        if self.engine.has_unfinished():
            self._step()

    def _add(self, stream: RequestStream) -> Exception | None:
        """Queue the request in the engine; the refusal (QueueFull, ContextTooLong, ...)
        is the handler's to map to a status."""
        try:
            stream.seq = self.engine.add_request(stream.prompt_ids, stream.params, request_id=stream.request_id,
                                                 speculate=stream.speculate, namespace=stream.namespace,
                                                 owner=stream.owner)
        except Exception as e:
            return e
        self._streams[stream.request_id] = stream
        return None

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as e:
            # Every request the step touched has left the waiting queue.
            waiting = {id(seq) for seq in self.engine.waiting}
            failed = [s for s in self._streams.values() if id(s.seq) not in waiting]
            log.exception("engine step failed; finishing its %d request(s) with an error", len(failed))
            message = f"generation failed: {type(e).__name__}: {e}"
            for stream in failed:
                if not self.engine.abort(stream.request_id, error=message):
                    # Admission itself failed, so the engine no longer lists it: free its slot here.
                    self.engine.runner.release(stream.seq)
                self._finish(stream.request_id, RequestOutput([], True, "error", message))
            outputs = []
        now = time.monotonic()
        total = self.engine.total_stats()
        self.metrics.on_engine(self.engine)
        self.metrics.on_spec(stats_delta(total, self._stats))
        self._stats = total
        for out in outputs:
            rid = out.seq.request_id
            stream = self._streams.get(rid)
            if stream is None:
                continue
            if stream.first_token_at is None:
                self.metrics.on_prefill(len(stream.prompt_ids))
            if out.new_tokens:
                first = stream.first_token_at is None
                self.metrics.on_tokens(len(out.new_tokens),
                                       ttft=now - stream.arrival if first else None,
                                       interval=None if first else now - stream.last_token_at)
                if first:
                    stream.first_token_at = now
                stream.last_token_at = now
            elif stream.first_token_at is None:
                stream.first_token_at = now  # prefilled, finished before any token (e.g. immediate EOS)
            if out.finished:
                self._finish(rid, RequestOutput(out.new_tokens, True, out.seq.finish_reason, out.seq.error))
            else:
                stream._push(RequestOutput(out.new_tokens))

    def _finish(self, rid: str, out: RequestOutput) -> None:
        stream = self._streams.pop(rid, None)
        if stream is None:
            return
        self.metrics.on_finished(out.finish_reason or "error", time.monotonic() - stream.arrival)
        stream._push(out)

    def _fail_all(self, inbox: list[RequestStream], message: str) -> None:
        for stream in inbox:
            stream._settle(EngineUnavailable(message))
        for rid in list(self._streams):
            try:
                self.engine.abort(rid, error=message)
            except Exception:
                log.exception("could not abort request %s", rid)
            self._finish(rid, RequestOutput([], True, "error", message))

    def _publish_load(self) -> None:
        cache, drafter = self.engine.runner.cache, self.engine.runner.drafter
        with self._cond:
            queued = len(self._inbox)
        self.metrics.set_load(len(self.engine.running), len(self.engine.waiting) + queued,
                              cache.num_slots - cache.num_free, cache.num_slots,
                              _drafter_requests(drafter))

    def _until_next_log(self) -> float | None:
        if self.log_interval <= 0:
            return None
        return max(0.05, self._last_log + self.log_interval - time.monotonic())

    def _maybe_log(self) -> None:
        if self.log_interval <= 0:
            return
        now = time.monotonic()
        if now - self._last_log < self.log_interval:
            return
        self._log_window(now)

    def _log_window(self, now: float) -> None:
        self._last_log = now
        line = self.metrics.window.line(len(self.engine.running), len(self.engine.waiting), now)
        if line:
            log.info(line)


def _drafter_requests(drafter) -> float:
    if drafter is None:
        return 0
    try:
        return drafter.num_requests()
    except NotImplementedError:  # a drafter that does not say
        return float("nan")
