"""Facts about the machine this process runs on: the CPU's name and flags, the cores
it may use, and how many of them other processes keep busy.

A leaf of the runtime: it imports nothing of dspark but `dspark/cpuinfo.py`, so the
loader (`--dtype auto` keys its cached precision pick by machine and backs off when
cores are busy) and the profiler (the step-time table's cache key and thread count)
both read it without importing each other.
"""

from __future__ import annotations

import os
import time

import torch

from dspark.cpuinfo import cpu_flags, cpu_model, usable_cpus, widest_isa  # noqa: F401 (re-exported)


def machine_id() -> str:
    cpu = cpu_model()
    # CPUs of one model name come with and without avx512 (cloud EPYCs): the ISA counts
    isa = widest_isa(cpu_flags())
    if isa:
        cpu += f" [{isa}]"
    if torch.cuda.is_available():
        cpu += " / " + torch.cuda.get_device_name()
    return f"{cpu} x{torch.get_num_threads()}t"


def busy_cores(interval: float = 0.5) -> float | None:
    """How many CPU cores OTHER processes kept busy during `interval` seconds: the
    machine's busy time (/proc/stat, without niced processes) minus this process's
    own CPU time, per second.
    None where /proc/stat is unavailable."""

    def machine_busy() -> float:
        with open("/proc/stat") as fh:
            v = [int(x) for x in fh.readline().split()[1:]]
        # `nice` time is left out: a niced process yields its core to ours, so it does
        # not make our threads wait at a barrier (a background job run with `nice`).
        user, _nice, system, _idle, _iowait, irq, softirq, steal = (v + [0] * 8)[:8]
        return (user + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")

    def own() -> float:
        t = os.times()
        return t.user + t.system

    try:
        b0, o0, t0 = machine_busy(), own(), time.perf_counter()
        time.sleep(interval)
        b1, o1, t1 = machine_busy(), own(), time.perf_counter()
    except (OSError, ValueError):
        return None
    return max(0.0, ((b1 - b0) - (o1 - o0)) / (t1 - t0))


def threads_for_load(threads: int, busy: float | None, cpus: int | None = None) -> int:
    """Threads that fit beside `busy` cores of other work: OpenMP threads that share a
    core with another process wait for it at every barrier, so a step with one thread
    too many runs many times slower than one with a thread fewer."""
    if busy is None or busy < 0.5:
        return threads
    free = max(1, (cpus or usable_cpus()) - int(busy + 0.5))
    return max(1, min(threads, free))
