"""STS calibration: metrics on exact cases, STS on synthetic miscalibrated
confidences (ECE drops, order within a position is kept), and `dspark calibrate` on
a tiny trained drafter."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dspark.calibration import auroc, brier, ece
from dspark.eval.calibration import reliability_diagram
from dspark.train.sts import ConfidenceSet, calibration_report, fit_sts


def test_metrics_exact_cases():
    assert auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert auroc([0.5, 0.5, 0.5], [0, 1, 1]) == pytest.approx(0.5)  # ties count half
    assert np.isnan(auroc([0.2, 0.3], [1, 1]))
    assert brier([1.0, 0.0, 0.5], [1, 0, 1]) == pytest.approx(0.25 / 3)
    # two bins: 0.2 (3 samples, 1 accepted) and 0.9 (1 sample, accepted)
    assert ece([0.2, 0.2, 0.2, 0.9], [1, 0, 0, 1], num_bins=10) == pytest.approx(0.75 * abs(0.2 - 1 / 3) + 0.25 * 0.1)
    assert ece([0.3] * 10, [1] * 3 + [0] * 7, num_bins=10) == pytest.approx(0.0, abs=1e-12)


def synthetic(num: int = 6000, gamma: int = 5, seed: int = 0) -> tuple[ConfidenceSet, list[float]]:
    """Raw logits z_k whose true per-position acceptance is sigmoid(z_k / T_k)."""
    g = torch.Generator().manual_seed(seed)
    true_t = [0.4, 2.5, 0.7, 3.0, 1.5][:gamma]
    z = torch.randn(num, gamma, generator=g, dtype=torch.float64) * 2 + 1
    p = torch.sigmoid(z / torch.tensor(true_t, dtype=torch.float64))
    ok = (torch.rand(num, gamma, generator=g, dtype=torch.float64) < p).double()
    valid = torch.ones(num, gamma, dtype=torch.bool)
    valid[: num // 10, 3:] = False  # blocks cut by the end of a response
    return ConfidenceSet(z, torch.cumprod(ok, dim=1), valid), true_t


def test_sts_reduces_ece_and_keeps_order():
    data, true_t = synthetic()
    temps = fit_sts(data)
    before = calibration_report(data, [1.0] * 5)
    after = calibration_report(data, temps)
    assert after["ece"] < 0.3 * before["ece"] and after["ece"] < 0.02
    for k in range(5):
        assert after["per_position_ece"][k] < before["per_position_ece"][k]
        assert after["per_position_ece"][k] < 0.03
    assert temps[0] == pytest.approx(true_t[0], rel=0.25)  # position 1 is plain temperature scaling
    raw, cal = data.survival([1.0] * 5), data.survival(temps)
    c_raw, c_cal = torch.sigmoid(data.logits), torch.sigmoid(data.logits / torch.tensor(temps, dtype=torch.float64))
    for k in range(5):  # a temperature keeps the order of confidences at each position
        assert torch.equal(torch.argsort(c_raw[:, k], stable=True), torch.argsort(c_cal[:, k], stable=True))
    assert (cal[:, 1:] <= cal[:, :-1] + 1e-12).all() and (raw[:, 1:] <= raw[:, :-1] + 1e-12).all()


def test_sts_is_sequential():
    """Position k is fitted against the survival with T_1..T_{k-1} already applied:
    changing position 2's data changes no earlier temperature."""
    data, _ = synthetic(3000, 3, seed=1)
    temps = fit_sts(data)
    other = ConfidenceSet(data.logits.clone(), data.accepted.clone(), data.valid)
    other.logits[:, 2] *= 3
    assert fit_sts(other)[:2] == temps[:2]


def test_sts_leaves_unreachable_positions_at_one():
    """A position that no block reaches accepted gives every temperature the same ECE
    (~0): STS keeps T = 1 there rather than an arbitrary grid end."""
    data, _ = synthetic(2000, 3, seed=2)
    data.accepted[:, 2] = 0
    data.logits[:, 2] = -30.0
    assert fit_sts(data)[2] == pytest.approx(1.0)


def test_reliability_diagram_writes_png(tmp_path):
    data, _ = synthetic(500, 3)
    s = data.survival([1.0] * 3)[data.valid].numpy()
    path = reliability_diagram(tmp_path / "r.png", {"raw": (s, data.accepted[data.valid].numpy())},
                               {"raw": [0.1, 0.2, 0.3]})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_calibrate_cli_on_a_tiny_drafter(tiny_dir, tiny_target, tiny_data, trained, tmp_path, capsys):
    import shutil

    from dspark.cli.main import main
    from dspark.drafters import load_drafter

    out = tmp_path / "dspark"
    shutil.copytree(trained["dspark"], out)
    rc = main(["calibrate", "--drafter", str(out), "--data", str(tiny_data), "--model", str(tiny_dir),
               "--dtype", "fp32", "--blocks-per-seq", "8", "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    cal = json.loads((out / "calibration.json").read_text())
    # one temperature per drafted position: the recipe's DSpark drafts 5 from its block of 5
    assert len(cal["temperatures"]) == 5 and all(t > 0 for t in cal["temperatures"])
    assert cal["after"]["ece"] <= cal["before"]["ece"] + 1e-9
    assert report["temperatures"] == cal["temperatures"]
    assert (out / "reliability.png").is_file()
    assert load_drafter(out, tiny_target.model).confidence_head.temperatures == cal["temperatures"]
    # a drafter without a confidence head is refused with one line
    flat = trained["dflash"]
    assert main(["calibrate", "--drafter", str(flat), "--data", str(tiny_data), "--model", str(tiny_dir)]) == 2
    assert "without a confidence head" in capsys.readouterr().err


from test_train import tiny_data, tiny_dir, tiny_target, trained  # noqa: E402,F401  (shared fixtures)
