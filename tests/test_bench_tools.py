"""`dspark bench fuzz|soak|overload|peers`: each tool answers `--help` under its own
subcommand name, and `peers` without `--engine` says which engines there are."""

from __future__ import annotations

import pytest

from dspark.cli.main import main


@pytest.mark.parametrize("argv", [["fuzz"], ["soak"], ["overload"], ["peers", "--engine", "llama.cpp"],
                                  ["peers", "--engine", "vllm"], ["peers"]])
def test_every_tool_explains_itself_under_its_subcommand(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        rc = main(["bench", *argv, "--help"])
        raise SystemExit(rc)  # `peers` alone prints its help and returns
    assert exit_.value.code in (0, None)
    out = capsys.readouterr().out
    assert out.startswith(f"usage: dspark bench {' '.join(argv)}")


def test_peers_without_an_engine_names_the_engines(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "peers", "--num-prompts", "2"])
    assert exit_.value.code == 2
    assert "--engine is required: one of llama.cpp, vllm" in capsys.readouterr().err
