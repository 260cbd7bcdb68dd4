"""`dspark train --method M` with no tuning flags trains the shipped recipe: the sizes
of the DSpark drafter that ships (its config.json), and the optimisation settings
scripts/train/shipped.sh trained all four with."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dspark.cli.main import build_parser
from dspark.drafters.config import DrafterConfig
from dspark.runtime.config import ModelConfig
from dspark.train.config import TrainConfig, shipped_taps

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "dspark" / "drafters" / "shipped"


def config_from_cli(monkeypatch, tmp: Path, *flags: str, method: str = "dspark") -> TrainConfig:
    """The TrainConfig `dspark train` builds from these flags (its run() with the
    training itself replaced)."""
    import dspark.cli.train as cli_train

    data = tmp / "d.jsonl"
    data.write_text("")
    args = build_parser().parse_args(["train", "--method", method, "--data", str(data), "--out", str(tmp / "o"),
                                      "--device", "cpu", *flags])
    built = {}
    monkeypatch.setattr(cli_train, "_train", lambda args, config, dist: built.setdefault("config", config) and 0)
    cli_train.run(args)
    return built["config"]


def test_no_flags_trains_the_shipped_dspark_drafter(monkeypatch, tmp_path: Path) -> None:
    shipped = json.loads((SHIPPED / "dspark" / "config.json").read_text())
    # the target's geometry as the shipped drafter records it (the default model's)
    target = ModelConfig.from_hf({**shipped, "num_hidden_layers": shipped["num_target_layers"]})
    cfg = config_from_cli(monkeypatch, tmp_path).for_target(target.num_layers, target.vocab_size)
    sizes = cfg.drafter_sizes()
    made = DrafterConfig.for_target("dspark", target, **sizes, draft_vocab_size=cfg.draft_vocab_size).to_dict()
    for key in ("block_size", "sample_from_anchor", "markov_rank", "target_layer_ids", "draft_vocab_size",
                "num_hidden_layers", "enable_confidence_head", "confidence_head_with_markov", "markov_head_type"):
        assert made[key] == shipped[key], key


def test_no_flags_train_with_the_shipped_scripts_settings(monkeypatch, tmp_path: Path) -> None:
    """The flags scripts/train/shipped.sh gave every method are the defaults now."""
    script = (ROOT / "scripts" / "train" / "shipped.sh").read_text()
    common = re.search(r"COMMON=\((.*?)\)", script, re.S).group(1)
    for method in ("dspark", "dflash", "eagle3", "mtp"):
        cfg = config_from_cli(monkeypatch, tmp_path, method=method)
        for flag, field in (("--batch-size", "batch_size"), ("--position-decay", "position_decay")):
            m = re.search(rf"{flag} (\S+)", common)
            if m:
                assert getattr(cfg, field) == float(m.group(1)), (method, flag)
        per_method = re.search(rf"\[{method}\]=\"([^\"]*)\"", script).group(1)
        m = re.search(r"--blocks-per-seq (\d+)", per_method)
        if m:
            assert cfg.blocks_per_seq == int(m.group(1)), method


def test_flags_still_override_the_recipe(monkeypatch, tmp_path: Path) -> None:
    cfg = config_from_cli(monkeypatch, tmp_path, "--markov-rank", "8", "--block-size", "5", "--no-sample-from-anchor",
                          "--draft-vocab-size", "0", "--position-decay", "4").for_target(30, 49152)
    assert (cfg.markov_rank, cfg.block_size, cfg.sample_from_anchor, cfg.draft_vocab_size, cfg.position_decay) \
        == (8, 5, False, 0, 4.0)
    assert "sample_from_anchor" not in cfg.drafter_sizes()


def test_continuing_a_drafter_keeps_its_sizes(tmp_path: Path) -> None:
    """--init DIR takes the drafter's own sizes: the recipe fills nothing in."""
    cfg = TrainConfig(method="dspark", data=["x"], out=str(tmp_path / "o"), init=str(SHIPPED / "dspark"))
    cfg = cfg.for_target(30, 49152)
    assert (cfg.markov_rank, cfg.block_size, cfg.sample_from_anchor, cfg.target_layer_ids) == (None, None, None, None)
    assert not cfg.draft_vocab_size and cfg.drafter_sizes() == {}


@pytest.mark.parametrize("layers, taps", [(30, [1, 8, 14, 20, 27, 28]), (24, [1, 6, 11, 16, 21, 22]),
                                          (4, [0, 1, 2, 3])])
def test_shipped_taps(layers: int, taps: list[int]) -> None:
    assert shipped_taps(layers) == taps


def test_small_vocabulary_is_kept_whole(tmp_path: Path) -> None:
    cfg = TrainConfig(method="dflash", data=["x"], out=str(tmp_path / "o")).for_target(4, 64)
    assert cfg.draft_vocab_size == 0 and cfg.target_layer_ids is None and cfg.block_size == 8
