"""Where a measurement was taken: the commit, whether the tree had changes, the CPU.

A benchmark writes this into its output when it runs (a sweep's `sweep.json`), so
that the record made from it later (`dspark bench record`) names the commit and the
machine that measured, not the ones that wrote the record. Imports no torch.
"""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path

from dspark.cpuinfo import cpu_flags, cpu_model, usable_cpus, widest_isa

ROOT = Path(__file__).resolve().parents[2]

#: The flags a record names (what decides which kernels run), in this order.
RECORDED_FLAGS = ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
                  "avx512_fp16", "amx_bf16", "amx_tile", "amx_int8")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, cwd=ROOT)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> str | None:
    """The short hash of the checkout dspark runs from (None outside a git checkout)."""
    return _git("rev-parse", "--short", "HEAD") or None


def git_dirty() -> bool | None:
    """Whether dspark's own files differ from that commit (None: unknown)."""
    status = _git("status", "--porcelain", "--untracked-files=no", "--", "dspark")
    return None if status is None else bool(status)


def cpu_kind(model: str, flags: set[str]) -> str:
    """The CPU kinds the records compare (`AMX Xeon`, `avx512_bf16 EPYC`, `AVX2 EPYC`),
    else the model name with its widest vector ISA."""
    if "EPYC" in model and "avx512_bf16" in flags:
        return "avx512_bf16 EPYC"
    if "EPYC" in model and "avx2" in flags and "avx512f" not in flags:
        return "AVX2 EPYC"
    if "Xeon" in model and {"amx_bf16", "amx_tile"} & flags:
        return "AMX Xeon"
    isa = widest_isa(flags)
    return f"{model} [{isa}]" if isa else model


def cpu_descriptor() -> dict:
    """The `cpu` field of a results record: kind, model, usable cores, the flags that count."""
    flags, model = cpu_flags(), cpu_model()
    return {"kind": cpu_kind(model, flags), "model": model, "cores": usable_cpus(),
            "flags": [f for f in RECORDED_FLAGS if f in flags]}


def provenance(command: str | None = None) -> dict:
    """What a benchmark's output keeps about its run."""
    return {"date": datetime.date.today().isoformat(), "commit": git_commit(), "dirty": git_dirty(),
            "cpu": cpu_descriptor(), "command": command}
