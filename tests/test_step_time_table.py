"""The step-time table the scheduler prices by: interpolation, the monotone and isotonic
fits, stalls, its file format and its checks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dspark.schedule import DrafterTimeTable, ScheduleError, StepTimeTable, isotonic, make_monotone, spikes


def test_target_time_interpolates_and_extrapolates():
    table = StepTimeTable(token_counts=[1, 16, 32], raw_ms=[10.0, 10.0, 18.0])
    assert table.target_time(0) == 0.0
    assert table.target_time(1) == pytest.approx(0.010)
    assert table.target_time(8) == pytest.approx(0.010)
    assert table.target_time(24) == pytest.approx(0.014)
    assert table.target_time(32) == pytest.approx(0.018)
    assert table.target_time(40) == pytest.approx(0.022)  # last slope, 0.5 ms per token
    assert table.max_token_count == 32
    single = StepTimeTable(token_counts=[8], raw_ms=[5.0])
    assert single.target_time(1) == single.target_time(100) == pytest.approx(0.005)
    np.testing.assert_allclose(table.step_times(np.array([1, 24, 40]), 3), [0.010, 0.014, 0.022])


def test_drafter_time_adds_to_step_time():
    drafter = DrafterTimeTable(method="dspark", request_counts=[1, 8], raw_ms=[1.0, 3.0])
    table = StepTimeTable(token_counts=[1, 16, 32], raw_ms=[10.0, 10.0, 18.0], drafter=drafter)
    assert table.drafter_time(0) == 0.0
    assert table.drafter_time(1) == pytest.approx(0.001)
    assert table.drafter_time(4) == pytest.approx((1.0 + 2.0 * 3 / 7) / 1000)
    assert table.step_time(24, 4) == pytest.approx(0.014 + (1.0 + 2.0 * 3 / 7) / 1000)
    assert StepTimeTable(token_counts=[1], raw_ms=[2.0]).drafter_time(5) == 0.0


def test_monotone_fix_is_a_running_max():
    assert make_monotone([10.0, 12.0, 11.0, 15.0, 14.0]) == [10.0, 12.0, 12.0, 15.0, 15.0]


def test_profile_stalls_are_found_and_tile_edges_are_not():
    counts = list(range(1, 13)) + [16]
    raw = [15.0, 24.0, 17.5, 17.4, 18.7, 20.5, 20.0, 22.0, 23.0, 24.0, 24.5, 25.0, 34.0]
    assert spikes(raw) == [1]  # 2 tokens above 3, 4 and 5 by 40 %: a stall
    edge = [10.0] * 6 + [16.0] * 6 + [16.5]  # a jump up at a tile edge is a cost, not a stall
    assert spikes(edge) == []


def test_isotonic_pools_by_weight():
    assert isotonic([59.0, 44.0], [1.0, 17.0]).tolist() == pytest.approx([44.833333, 44.833333])
    assert isotonic([1.0, 3.0, 2.0, 4.0], [1, 1, 1, 1]).tolist() == [1.0, 2.5, 2.5, 4.0]
    assert isotonic([], []).size == 0
    table = StepTimeTable(token_counts=[1, 2, 4, 8, 16], raw_ms=[10.0, 12.0, 11.0, 15.0, 14.0])
    assert table.raw_ms == [10.0, 12.0, 11.0, 15.0, 14.0]
    assert table.step_ms == [10.0, 12.0, 12.0, 15.0, 15.0]
    assert table.target_time(4) == pytest.approx(0.012)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(token_counts=[1, 2], raw_ms=[1.0, 2.0], step_ms=[2.0, 1.0]), "non-decreasing"),
        (dict(token_counts=[1, 2], raw_ms=[1.0]), "each count"),
        (dict(token_counts=[2, 1], raw_ms=[1.0, 2.0]), "ascending"),
        (dict(token_counts=[], raw_ms=[]), "no measurements"),
        (dict(token_counts=[1], raw_ms=[0.0]), "positive"),
    ],
)
def test_bad_tables_are_refused(kwargs, message):
    with pytest.raises(ScheduleError, match=message):
        StepTimeTable(**kwargs)


def test_json_round_trip(tmp_path):
    drafter = DrafterTimeTable(method="dspark", request_counts=[1, 4, 16], raw_ms=[1.5, 1.4, 2.5])
    table = StepTimeTable(
        token_counts=[1, 8, 64], raw_ms=[9.0, 8.5, 30.0], drafter=drafter,
        model="Qwen/Qwen3-4B", dtype="bfloat16", device="cuda:0", machine="h100-x1", context_len=1024,
        conditions={"threads": 2, "median_spread": 0.05, "cached": True},
    )
    path = tmp_path / "tables" / "step_time.json"
    table.save(path)
    on_disk = json.loads(path.read_text())
    assert set(on_disk) == {"model", "dtype", "device", "machine", "context_len",
                            "token_counts", "raw_ms", "step_ms", "drafter", "conditions"}
    assert on_disk["conditions"] == {"threads": 2, "median_spread": 0.05, "cached": True}
    assert on_disk["step_ms"] == [9.0, 9.0, 30.0]
    assert on_disk["drafter"] == {"method": "dspark", "request_counts": [1, 4, 16],
                                  "raw_ms": [1.5, 1.4, 2.5], "step_ms": [1.5, 1.5, 2.5]}
    loaded = StepTimeTable.load(path)
    assert loaded == table
    assert loaded.step_time(20, 4) == table.step_time(20, 4)
    no_drafter = StepTimeTable(token_counts=[1], raw_ms=[3.0])
    assert json.loads(no_drafter.to_json())["drafter"] is None
    assert StepTimeTable.from_json(no_drafter.to_json()) == no_drafter


def test_loading_bad_files_says_what_is_wrong(tmp_path):
    with pytest.raises(ScheduleError, match="dspark profile"):
        StepTimeTable.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ScheduleError, match="not valid JSON"):
        StepTimeTable.load(bad)
    bad.write_text(json.dumps({"raw_ms": [1.0]}))
    with pytest.raises(ScheduleError, match="token_counts"):
        StepTimeTable.load(bad)


def test_synthetic_is_flat_then_linear():
    table = StepTimeTable.synthetic(base_ms=10.0, knee=16, per_token_ms=0.5, max_tokens=256, drafter_ms=2.0)
    assert table.target_time(1) == table.target_time(16) == pytest.approx(0.010)
    assert table.target_time(20) == pytest.approx(0.012)
    assert table.target_time(256) == pytest.approx(0.130)
    assert table.step_time(20, 7) == pytest.approx(0.014)


# -- policies: exact cases -----------------------------------------------------------
