"""Offline acceptance through the real engine on a tiny trained drafter: numbers in
range, the table, the plot, and the CLI's input checks."""

from __future__ import annotations

import json

import pytest

from dspark.eval.acceptance import AcceptanceResult, acceptance_plot, format_table, measure_acceptance

from test_train import tiny_data, tiny_dir, tiny_target, train_config  # noqa: F401  (shared fixtures)


@pytest.fixture(scope="module")
def trained(tiny_target, tiny_data, tmp_path_factory):
    from dspark.train import Trainer

    out = {}
    for method in ("dspark", "mtp"):
        path = tmp_path_factory.mktemp("eval") / method
        Trainer(train_config(method, tiny_data, path, max_steps=10), tiny_target).run()
        out[method] = path
    return out


def test_acceptance_in_range(trained, tiny_target, tiny_data):
    prompts = [json.loads(line)["prompt_token_ids"] for line in tiny_data.read_text().splitlines()[:4]]
    r = measure_acceptance(tiny_target, trained["dspark"], 7, prompts, max_tokens=12, domain="math")
    assert r.block == 4  # the drafter's block holds 4 drafted tokens; asking for 7 runs 4
    assert r.rounds > 0 and 1.0 <= r.acceptance_length <= 5.0
    assert len(r.per_position) == 4 and all(0.0 <= x <= 1.0 for x in r.per_position)
    # per-position acceptance is conditional on being verified, and τ counts the accepted drafts
    assert r.per_position[0] * r.rounds == pytest.approx(round(r.per_position[0] * r.rounds))
    m = measure_acceptance(tiny_target, trained["mtp"], 7, prompts, max_tokens=12, domain="math")
    assert m.block == 1 and 1.0 <= m.acceptance_length <= 2.0
    assert m.acceptance_length == pytest.approx(1 + m.per_position[0])


def test_table_and_plot(tmp_path):
    rs = [AcceptanceResult("a", "dspark", 7, d, 3, 2.0 + i, [0.5, 0.4], 10) for i, d in enumerate(["math", "code"])]
    rs.append(AcceptanceResult("m", "mtp", 1, "math", 3, 1.5, [0.5], 10))
    table = format_table(rs)
    assert "| a | dspark | 7 | 2.00 | 3.00 | 2.50 |" in table
    assert acceptance_plot(tmp_path / "p.png", rs).read_bytes()[:4] == b"\x89PNG"


def test_cli_checks_its_inputs(tmp_path, capsys):
    from dspark.cli.main import main

    assert main(["eval", "acceptance", "--drafter", str(tmp_path), "--block", "x"]) == 2
    assert "--block" in capsys.readouterr().err
    assert main(["eval", "acceptance", "--drafter", str(tmp_path), "--domains", "poetry"]) == 2
    assert "--domains" in capsys.readouterr().err
    assert main(["eval", "acceptance", "--drafter", str(tmp_path)]) == 2
    assert "config.json" in capsys.readouterr().err
