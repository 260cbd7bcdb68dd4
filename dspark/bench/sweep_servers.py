"""The servers a sweep compares: how a configuration is named, and its server
started (and later stopped) when the sweep needs it.

A configuration is one of
- a `dspark serve` speculative config (JSON, or `none`): the sweep starts
  `dspark serve` on 127.0.0.1 with a free port and the shared `server_args`;
- `name=URL`: a server that is already running; the sweep only sends load;
- `name=CMD`: a shell command with a `{port}` placeholder that starts an
  OpenAI-compatible server; the sweep runs it and stops it.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from dspark.presets import PRESETS

from .runner import BenchError
from .server_process import ServerProcess, ServerStartError, dspark_serve_command, free_port

#: the configurations a sweep compares by default, with the drafters shipped for the model
DEFAULT_CONFIGS: dict[str, dict | str | None] = {
    "none": None,
    "mtp": {"method": "mtp"},
    "eagle3": {"method": "eagle3"},
    "dflash": {"method": "dflash", "enable_adaptive_verification": False},
    "dspark": {"method": "dspark", "enable_adaptive_verification": False},
    "dspark-adaptive": {"method": "dspark", "enable_adaptive_verification": True},
}
#: names `--configs` accepts on their own
KNOWN_CONFIGS: dict[str, dict | str | None] = {
    **DEFAULT_CONFIGS, "ngram": PRESETS["lookup"],
    "hybrid": PRESETS["hybrid"],
    # the server's own default (`--speculative-config default`: hybrid with the
    # plain-decoding fallback at high load), named, not spelled out: the load
    # generator knows no engine
    "default": "default",
}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


@dataclass(frozen=True)
class ServerConfig:
    name: str
    kind: str  # "dspark" | "url" | "command"
    speculative: dict | str | None = None  # kind "dspark": None = no speculation, "default" = the server's
    url: str | None = None
    command: str | None = None

    def describe(self) -> dict:
        if self.kind == "dspark":
            return {"name": self.name, "kind": self.kind, "speculative_config": self.speculative}
        return {"name": self.name, "kind": self.kind, self.kind: self.url or self.command}


def parse_server_config(item: str) -> ServerConfig:
    """`NAME` (one of KNOWN_CONFIGS), `NAME=JSON`, `NAME=none`, `NAME=default`, `NAME=URL` or `NAME=CMD`."""
    name, sep, value = item.partition("=")
    name, value = name.strip(), value.strip()
    if not _NAME.fullmatch(name):
        raise BenchError(f"configuration name {name!r} must be letters, digits and ._+- (it names files)")
    if not sep:
        if name not in KNOWN_CONFIGS:
            raise BenchError(f"unknown configuration {name!r}; use one of {', '.join(KNOWN_CONFIGS)} or "
                             "NAME=JSON, NAME=URL, NAME=CMD")
        return ServerConfig(name, "dspark", KNOWN_CONFIGS[name])
    if value.lower() == "none":
        return ServerConfig(name, "dspark", None)
    if value.lower() == "default":
        return ServerConfig(name, "dspark", "default")
    if value.startswith("{"):
        try:
            spec = json.loads(value)
        except json.JSONDecodeError as e:
            raise BenchError(f"configuration {name!r}: the speculative config is not valid JSON: {e}") from None
        if not isinstance(spec, dict):
            raise BenchError(f"configuration {name!r}: the speculative config must be a JSON object")
        return ServerConfig(name, "dspark", spec)
    if value.startswith(("http://", "https://")):
        return ServerConfig(name, "url", url=value)
    if "{port}" not in value:
        raise BenchError(f"configuration {name!r}: a start command needs a {{port}} placeholder for the port "
                         f"the sweep chooses, got {value!r}")
    return ServerConfig(name, "command", command=value)


class LaunchedServer:
    """A configuration's server: `start()` returns its URL, starting the process when
    the configuration has one (each start writes its own log); `stop()` stops it and
    may be called any number of times. `entry` (the configuration's record in the
    results) gets the command, the log, the pid and the first start-up time."""

    def __init__(self, server: ServerConfig, entry: dict, log_dir: Path, server_args: list[str],
                 timeout: float, grace_period: float) -> None:
        self.server, self.entry, self.log_dir = server, entry, log_dir
        self.server_args, self.timeout, self.grace_period = server_args, timeout, grace_period
        self.process: ServerProcess | None = None
        self.url: str | None = None

    def start(self, log_name: str | None = None) -> str:
        s = self.server
        if s.kind == "url":
            self.url = s.url
            return s.url
        port = free_port()
        if s.kind == "dspark":
            spec = ("none" if s.speculative is None else s.speculative if isinstance(s.speculative, str)
                    else json.dumps(s.speculative))
            command: list[str] | str = dspark_serve_command(port, spec, self.server_args)
        else:
            command = s.command.replace("{port}", str(port))
        log_path = self.log_dir / f"{log_name or s.name}.log"
        self.entry["log"] = str(log_path)
        self.entry["command"] = command if isinstance(command, str) else shlex.join(command)
        self.process = ServerProcess(command, f"http://127.0.0.1:{port}", log_path, self.timeout, self.grace_period)
        try:
            self.process.start()
        except ServerStartError as e:
            raise ServerStartError(f"configuration {s.name!r} did not start: {e}") from None
        finally:
            self.entry["pid"] = self.process.proc.pid if self.process.proc else None
        if self.entry.get("startup_s") is None:
            self.entry["startup_s"] = self.process.startup_s
        self.url = self.process.url
        return self.url

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
        self.url = None
