"""Serving: an OpenAI-compatible HTTP server around the engine.

`create_app` builds the FastAPI app; `AsyncEngine` runs the engine on one thread
and relays tokens to asyncio handlers; `metrics` holds the Prometheus counters and
the periodic log line. This package knows HTTP and the OpenAI API; the engine
below it knows neither.
"""

from .app import create_app
from .config import ServeConfig, build_engine
from .server import ServerThread, run_server

__all__ = ["ServeConfig", "ServerThread", "build_engine", "create_app", "run_server"]
