"""Offline acceptance through the real engine on a tiny trained drafter: numbers in
range, the table, the plot, and the CLI's input checks."""

from __future__ import annotations

import json
import math

import pytest

from dspark.eval.acceptance import AcceptanceResult, acceptance_plot, format_table, measure_acceptance

from test_train import tiny_data, tiny_dir, tiny_target, trained  # noqa: F401  (shared fixtures)


def test_acceptance_in_range(trained, tiny_target, tiny_data):
    prompts = [json.loads(line)["prompt_token_ids"] for line in tiny_data.read_text().splitlines()[:4]]
    r = measure_acceptance(tiny_target, trained["dspark"], 7, prompts, max_tokens=12, domain="math")
    # the recipe's DSpark samples from the anchor: its block of 5 drafts 5; asking for 7 runs 5
    assert r.block == 5
    assert r.rounds > 0 and 1.0 <= r.acceptance_length <= 6.0
    assert len(r.per_position) == 5 and all(0.0 <= x <= 1.0 for x in r.per_position)
    # at a fixed length position 1 is verified every round, so its conditional and
    # verified rates agree; later conditional rates divide by the accepted prefix
    assert r.conditional[0] == pytest.approx(r.per_position[0])
    assert all(math.isnan(c) or 0.0 <= c <= 1.0 for c in r.conditional)
    m = measure_acceptance(tiny_target, trained["mtp"], 7, prompts, max_tokens=12, domain="math")
    assert m.block == 1 and 1.0 <= m.acceptance_length <= 2.0
    assert m.acceptance_length == pytest.approx(1 + m.per_position[0])


def test_table_and_plot(tmp_path):
    rs = [AcceptanceResult("a", "dspark", 7, d, 3, 2.0 + i, [0.5, 0.4], [0.5, 0.8], 10) for i, d in enumerate(["math", "code"])]
    rs.append(AcceptanceResult("m", "mtp", 1, "math", 3, 1.5, [0.5], [0.5], 10))
    table = format_table(rs)
    assert "| a | dspark | 7 | 2.00 | 3.00 | 2.50 |" in table
    assert acceptance_plot(tmp_path / "p.png", rs).read_bytes()[:4] == b"\x89PNG"


def test_cli_checks_its_inputs(tmp_path, capsys):
    from dspark.cli.main import main

    assert main(["eval", "acceptance", "--drafter", str(tmp_path), "--block", "x"]) == 2
    assert "--block" in capsys.readouterr().err
    assert main(["eval", "acceptance", "--drafter", str(tmp_path), "--drafter-weights", "bf16,fp8"]) == 2
    assert "--drafter-weights" in capsys.readouterr().err
    assert main(["eval", "acceptance", "--drafter", str(tmp_path), "--domains", "poetry"]) == 2
    assert "--domains" in capsys.readouterr().err
    assert main(["eval", "acceptance", "--drafter", str(tmp_path)]) == 2
    assert "config.json" in capsys.readouterr().err


@pytest.mark.slow
def test_shipped_drafters_on_the_default_model(default_target):
    """The shipped drafters fit the size budget, load, and decode with acceptance in range."""
    from dspark.engine.config import SHIPPED_DIR

    sizes = {m: (SHIPPED_DIR / m / "model.safetensors").stat().st_size for m in ("dspark", "dflash", "eagle3", "mtp")}
    assert max(sizes.values()) <= 40e6 and sum(sizes.values()) <= 100e6, sizes
    prompt = default_target.tokenizer.chat_prompt("What is 12 times 7? Answer briefly.")
    for method in sizes:
        r = measure_acceptance(default_target, SHIPPED_DIR / method, 7, [prompt], max_tokens=16)
        assert r.rounds > 0 and 1.0 <= r.acceptance_length <= r.block + 1
