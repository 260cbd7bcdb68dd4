"""Running the app under uvicorn: for the CLI (HTTP on a thread, the engine loop on
the main thread) or entirely on a background thread (tests, in-process clients).

Shutdown on SIGINT/SIGTERM is uvicorn's: stop accepting connections, give
in-flight requests `shutdown_timeout` seconds, then end the lifespan, which fails
whatever is left with an explicit error and stops the engine loop.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading

import uvicorn
from fastapi import FastAPI

log = logging.getLogger("dspark.serve")


def run_server(app: FastAPI, host: str, port: int, shutdown_timeout: float = 30.0) -> bool:
    """Serve until SIGINT/SIGTERM, with the engine loop on the calling (main) thread
    and uvicorn's event loop on another; False if the server could not start (e.g.
    the port is taken; uvicorn has logged why).

    An app whose engine is not built yet (`create_app(config, build=False)`) listens
    first and builds it here, on the main thread, so that /health answers during
    start-up; a signal during the build stops it at once."""
    config = uvicorn.Config(app, host=host, port=port, log_level="info", access_log=False,
                            timeout_graceful_shutdown=shutdown_timeout, lifespan="on")
    server = uvicorn.Server(config)
    state = app.state.dspark
    if state.async_engine is not None:
        state.async_engine.claim_foreground()
    http = threading.Thread(target=server.run, name="dspark-http", daemon=True)
    building = threading.Event()

    def on_signal(sig: int, frame) -> None:
        server.handle_exit(sig, frame)
        if building.is_set():
            raise _Interrupted

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        http.start()
        if state.async_engine is None:
            while not server.started and http.is_alive():
                http.join(0.05)
            if not server.started:
                return False
            building.set()
            try:
                state.build()
            except _Interrupted:
                log.info("stopped during start-up")
                http.join()
                return True
            except BaseException:
                server.should_exit = True
                http.join()
                raise
            finally:
                building.clear()
            state.async_engine.claim_foreground()
        # The loop ends when the lifespan shuts it down, or when uvicorn ends without one.
        state.async_engine.run_foreground(keep_running=http.is_alive)
        http.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return server.started


class _Interrupted(BaseException):
    """A signal arrived while the engine was being built."""


class ServerThread:
    """The app on 127.0.0.1 (a free port by default) in a background thread, for
    tests and in-process clients:

        with ServerThread(create_app(engine)) as server:
            httpx.get(server.url + "/health")
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, startup_timeout: float = 60.0) -> None:
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = self.sock.getsockname()[:2]
        self.startup_timeout = startup_timeout
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="dspark-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "ServerThread":
        self.thread.start()
        self.thread.join(0)
        waited = 0.0
        while not self.server.started:
            if not self.thread.is_alive() or waited > self.startup_timeout:
                raise RuntimeError(f"the server did not start on {self.url}")
            self.thread.join(0.05)
            waited += 0.05
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
