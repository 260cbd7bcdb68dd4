"""The step-time profile under a busy machine: the probe of other processes' CPU
time, fewer threads when cores are taken, no caching of noisy tables, re-measuring a
cached table that a spot check contradicts or that cannot be read, and the serving
watch that falls back to fewer threads when steps run far slower than the table."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from dspark.profiling import measure as profiler
from dspark.profiling import tables as profiling
from dspark.profiling.watch import StepWatch
from dspark.schedule.step_time import StepTimeTable


def test_threads_for_load():
    assert profiler.threads_for_load(2, None, cpus=2) == 2
    assert profiler.threads_for_load(2, 0.2, cpus=2) == 2
    assert profiler.threads_for_load(2, 1.0, cpus=2) == 1
    assert profiler.threads_for_load(8, 2.6, cpus=8) == 5
    assert profiler.threads_for_load(2, 5.0, cpus=2) == 1  # never below one


def test_busy_cores_sees_another_process_spinning():
    if profiler.busy_cores(0.05) is None:
        pytest.skip("no /proc/stat here")
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = profiler.busy_cores(1.0)
    finally:
        spin.kill()
        spin.wait()
    assert busy >= 0.6, busy  # one core taken by the spinner (our own CPU time is subtracted)


@pytest.fixture()
def tiny(tmp_path, monkeypatch):
    from conftest import make_tiny_hf_model
    from dspark.runtime.loader import load_transformer
    from dspark.runtime.target import Target

    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))
    make_tiny_hf_model("llama", tmp_path / "m")
    threads = torch.get_num_threads()
    yield Target(load_transformer(tmp_path / "m", torch.float32), None, tmp_path / "m", "tiny")
    torch.set_num_threads(threads)


def test_quiet_profile_is_cached_with_its_conditions_and_reused(tiny, monkeypatch):
    monkeypatch.setattr(profiler, "busy_cores", lambda interval=0.5: 0.0)
    monkeypatch.setattr(profiling, "spot_check", lambda *a: (True, "ok"))
    monkeypatch.setattr(profiling, "NOISY_SPREAD", float("inf"))  # tiny steps are all jitter
    table, path, cached = profiling.profile_target(tiny, max_tokens=16, repeats=2, warmup=1, quiet=True)
    assert not cached and path.is_file()
    assert table.conditions["cached"] and table.conditions["threads"] == torch.get_num_threads()
    assert StepTimeTable.load(path).conditions == table.conditions
    again, path2, cached2 = profiling.profile_target(tiny, max_tokens=16, repeats=2, warmup=1, quiet=True)
    assert cached2 and path2 == path and again.raw_ms == table.raw_ms


def test_busy_machine_gets_fewer_threads_and_no_cache(tiny, monkeypatch, capsys):
    torch.set_num_threads(2)
    monkeypatch.setattr(profiler, "busy_cores", lambda interval=0.5: 1.0)
    monkeypatch.setattr(profiler, "usable_cpus", lambda: 2)
    table, path, cached = profiling.profile_target(tiny, max_tokens=16, repeats=2, warmup=1)
    err = capsys.readouterr().err
    assert torch.get_num_threads() == 1 and "using 1 thread(s) instead of 2" in err
    assert "not cached" in err and not path.is_file() and not table.conditions["cached"]
    assert table.conditions["threads_requested"] == 2


def test_a_cached_table_that_no_longer_holds_or_is_corrupt_is_measured_again(tiny, monkeypatch, capsys):
    monkeypatch.setattr(profiler, "busy_cores", lambda interval=0.5: 0.0)
    monkeypatch.setattr(profiling, "NOISY_SPREAD", float("inf"))
    _, path, _ = profiling.profile_target(tiny, max_tokens=16, repeats=2, warmup=1, quiet=True)
    # a table 1000x faster than this machine: the spot check (real forwards) rejects it
    fake = StepTimeTable.load(path)
    StepTimeTable(fake.token_counts, [t / 1000 for t in fake.raw_ms], model=fake.model).save(path)
    table, _, cached = profiling.profile_target(tiny, max_tokens=16, repeats=2, warmup=1)
    assert not cached and "no longer holds" in capsys.readouterr().err
    assert StepTimeTable.load(path).raw_ms == table.raw_ms
    path.write_text("{ not json")
    _, _, cached = profiling.profile_target(tiny, max_tokens=16, repeats=2, warmup=1)
    assert not cached and "cannot use the cached step-time table" in capsys.readouterr().err
    StepTimeTable.load(path)  # rewritten, readable


def test_step_watch_falls_back_to_fewer_threads_and_returns(monkeypatch, capsys):
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        table = StepTimeTable.synthetic(base_ms=10, knee=16, per_token_ms=0.5, max_tokens=256)
        watch = StepWatch(table, window=4, factor=3.0, recheck=3)
        busy = {"now": 1.0}
        monkeypatch.setattr(profiler, "busy_cores", lambda interval=0.5: busy["now"])
        monkeypatch.setattr(profiler, "usable_cpus", lambda: 2)
        for _ in range(4):
            watch.record(8, 2, 0.012)  # 1.2x the table: fine
        assert torch.get_num_threads() == 2 and watch.slow_windows == 0
        for _ in range(4):
            watch.record(8, 2, 0.5)  # 50x the table
        assert watch.slow_windows == 1 and watch.fallbacks == 1 and torch.get_num_threads() == 1
        busy["now"] = 0.0
        for _ in range(3):
            watch.record(8, 2, 0.012)
        assert torch.get_num_threads() == 2 and not watch.reduced
        err = capsys.readouterr().err
        assert "using 1 thread(s)" in err and "back to 2 threads" in err
    finally:
        torch.set_num_threads(threads)


def test_step_watch_without_a_table_falls_back_against_its_fastest_steps(monkeypatch, capsys):
    """Plain decoding has no profile: a step is compared with the fastest step of its
    size seen so far, and the same thread fallback follows."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        busy = {"now": 0.0}
        monkeypatch.setattr(profiler, "busy_cores", lambda interval=0.5: busy["now"])
        monkeypatch.setattr(profiler, "usable_cpus", lambda: 2)
        watch = StepWatch(None, window=4, factor=3.0, recheck=3)  # a quiet start: all threads
        busy["now"] = 1.0
        for seconds in (0.020, 0.018, 0.021, 0.019, 0.200):  # a 100-token prefill: another size
            watch.record(1 if seconds < 0.1 else 100, 1, seconds)
        assert torch.get_num_threads() == 2 and watch.slow_windows == 0
        for _ in range(8):  # two windows: the first still holds the quick steps
            watch.record(1, 1, 0.090)  # 5x its fastest one-token step, a core taken
        assert watch.slow_windows == 1 and watch.fallbacks == 1 and torch.get_num_threads() == 1
        busy["now"] = 0.0
        for _ in range(3):
            watch.record(1, 1, 0.030)
        assert torch.get_num_threads() == 2 and not watch.reduced
        assert "using 1 thread(s)" in capsys.readouterr().err
        busy["now"] = 1.0  # started beside another process: fewer threads from the first step
        late = StepWatch(None)
        assert late.reduced and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


def test_step_watch_rescales_a_table_that_drifted(monkeypatch, capsys):
    table = StepTimeTable.synthetic(base_ms=10, knee=16, per_token_ms=0.5, max_tokens=256)
    before = [table.target_time(n) for n in (1, 8, 64)]
    watch = StepWatch(table, window=10**9)  # the thread fallback out of the way
    monkeypatch.setattr(profiler, "busy_cores", lambda interval=0.5: 0.0)
    for _ in range(watch.DRIFT_WINDOW):
        watch.record(8, 0, 1.3 * table.step_time(8, 0))  # within the bound: kept
    assert watch.refreshes == 0 and [table.target_time(n) for n in (1, 8, 64)] == before
    for _ in range(watch.DRIFT_WINDOW):
        watch.record(8, 0, 2.0 * before[1])  # the machine is twice as slow as its table says
    assert watch.refreshes == 1
    assert [table.target_time(n) for n in (1, 8, 64)] == pytest.approx([2 * t for t in before])
    assert "rescaled" in capsys.readouterr().err
    monkeypatch.setattr(profiler, "busy_cores", lambda interval=0.5: 1.0)  # another process: not the table
    for _ in range(watch.DRIFT_WINDOW):
        watch.record(8, 0, 4.0 * before[1])
    assert watch.refreshes == 1


def test_a_stalled_profile_point_is_measured_again_and_the_lower_median_kept(tiny, monkeypatch):
    counts = [1, 2, 3, 4, 5, 6]
    first = {1: 10.0, 2: 30.0, 3: 12.0, 4: 13.0, 5: 14.0, 6: 15.0}  # 2 tokens stalled once
    again = {2: 11.0}
    calls = []

    def fake(target, token_counts, *a, **k):
        calls.append(list(token_counts))
        table = first if len(calls) == 1 else again
        spreads = a[5] if len(a) > 5 else k.get("spreads")
        if spreads is not None:
            spreads.extend(0.01 for _ in token_counts)
        return [table[n] for n in token_counts]

    monkeypatch.setattr(profiler, "measure_step_times", fake)
    monkeypatch.setattr(profiler, "busy_cores", lambda interval=0.5: 0.0)
    monkeypatch.setattr(profiler, "default_token_counts", lambda max_tokens: counts)
    monkeypatch.setattr(profiling, "NOISY_SPREAD", float("inf"))
    table, _, _ = profiling.profile_target(tiny, max_tokens=6, quiet=True)
    assert calls == [counts, [2]]  # only the stalled point, measured once more
    assert table.raw_ms == [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
    assert table.step_ms[1] == 11.0  # not a 30 ms plateau from 2 tokens to 6
    assert table.conditions["remeasured"] == [2]


def test_profile_runs_are_spread_over_interleaved_passes(tiny):
    calls = []
    model = tiny.model

    class Recording:  # the model, with the tokens of every forward written down
        def __getattr__(self, name):
            return getattr(model, name)

        def __call__(self, batch, cache, *a, **k):
            calls.append(int(batch.input_ids.numel()))
            return model(batch, cache, *a, **k)

    tiny.model = Recording()
    try:
        ms = profiler.measure_step_times(tiny, [1, 8, 16], context_len=16, tokens_per_request=8, warmup=2,
                                         repeats=5, passes=3)
    finally:
        tiny.model = model
    assert len(ms) == 3 and all(t > 0 for t in ms)
    # the context prefill, then per pass every point: warm-ups (2 before its first pass, 1 after),
    # then its share of the 5 timed runs (2, 2, 1): a slow spell hits one pass, not one point
    sweep = lambda warm, runs: [n for n in (1, 8, 16) for n in [n] * (warm + runs)]  # noqa: E731
    assert calls == [16] + sweep(2, 2) + sweep(1, 2) + sweep(1, 1)
