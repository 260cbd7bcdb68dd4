"""A server started as a subprocess for a benchmark, and stopped without leftovers.

The process runs in its own session (process group), so stopping it reaches every
process it spawned, a shell's children included: SIGTERM to the group, then
SIGKILL after a grace period. On Linux the direct child also gets SIGTERM if the
benchmark process dies without cleaning up. Output goes to a log file, whose tail
is quoted when the server fails to start.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

HEALTH_POLL_S = 0.5


class ServerStartError(RuntimeError):
    """A server did not become healthy; the message quotes its log."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the server binds it shortly after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def dspark_serve_command(port: int, speculative_config: str, server_args: list[str]) -> list[str]:
    """`dspark serve` on 127.0.0.1:`port` by this Python interpreter."""
    return [sys.executable, "-m", "dspark.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--speculative-config", speculative_config, *server_args]


def _parent_death_signal():
    """A function for `preexec_fn` that asks Linux to SIGTERM the child when its
    parent dies; None elsewhere. libc is resolved here, in the parent: loading a
    library between fork and exec can deadlock when other threads exist."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, int(signal.SIGTERM))


class ServerProcess:
    """`with ServerProcess(cmd, url, log_path) as server:` starts `cmd` (a list, or
    a string run by the shell), waits until `url`/health answers 200, and stops the
    whole process group on exit."""

    def __init__(self, command: list[str] | str, url: str, log_path: str | Path,
                 startup_timeout: float = 900.0, grace_period: float = 30.0) -> None:
        self.command = command
        self.url = url.rstrip("/")
        self.log_path = Path(log_path)
        self.startup_timeout = startup_timeout
        self.grace_period = grace_period
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    def start(self) -> "ServerProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command, shell=isinstance(self.command, str), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_parent_death_signal())
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        t0 = time.monotonic()
        with httpx.Client(timeout=5.0) as client:
            while True:
                if self.proc.poll() is not None:
                    raise ServerStartError(f"the server exited with status {self.proc.returncode} before it was "
                                           f"healthy; {self._log_tail()}")
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        self.startup_s = time.monotonic() - t0
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() - t0 > self.startup_timeout:
                    raise ServerStartError(f"the server was not healthy at {self.url}/health after "
                                           f"{self.startup_timeout:g} s (raise --server-timeout if start-up is "
                                           f"slow); {self._log_tail()}")
                time.sleep(HEALTH_POLL_S)

    def _log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return f"no log at {self.log_path}"
        if not text:
            return f"its log {self.log_path} is empty"
        return f"the last lines of {self.log_path}:\n  " + "\n  ".join(text[-lines:])

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after the grace period; idempotent.
        The group is signalled even when the leader is gone, for children it left."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # the leader of its own session
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_period
        while time.monotonic() < deadline:
            self.proc.poll()  # reap the leader: a zombie would still count as a member
            if not _group_alive(pgid):
                break
            time.sleep(0.1)
        _signal_group(pgid, signal.SIGKILL)
        self.proc.wait()

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False
