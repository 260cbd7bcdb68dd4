"""Serving: an OpenAI-compatible HTTP server around the engine.

`create_app` builds the FastAPI app; `AsyncEngine` runs the engine on one thread
and relays tokens to asyncio handlers; `metrics` holds the Prometheus counters and
the periodic log line. This package knows HTTP and the OpenAI API; the engine
below it knows neither.
"""

from __future__ import annotations

import importlib

__all__ = ["ServeConfig", "ServerThread", "build_engine", "create_app", "run_server"]
_HOME = {"ServeConfig": "config", "build_engine": "config", "create_app": "app", "ServerThread": "server",
         "run_server": "server"}


def __getattr__(name: str):
    # imported on first use, so that `dspark.serve.config` can be read without
    # loading the app, the engine and torch
    if name in _HOME:
        return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
