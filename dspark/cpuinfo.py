"""The CPU's name and flags from /proc/cpuinfo (empty where there is none), its widest
vector ISA and the cores this process may use. A leaf that imports nothing, not even
torch, so that the benchmark records (`dspark.bench.provenance`) and the runtime
(`runtime/machine.py`) read the machine the same way."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def _field(name: str) -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(name):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> set[str]:
    return set((_field("flags") or "").split())


def cpu_model() -> str:
    """The CPU's model name (the platform's processor where /proc/cpuinfo has none)."""
    return _field("model name") or platform.processor() or platform.machine()


def widest_isa(flags: set[str]) -> str | None:
    """The widest vector ISA among the flags that choose the kernels (None: none of them)."""
    return next((f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if f in flags), None)


def usable_cpus() -> int:
    """The cores this process may run on (its affinity; the machine's count where unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
