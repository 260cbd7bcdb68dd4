"""Shared steps of the peer-engine checks (`dspark bench peers --engine llama.cpp|vllm`): run a
command into a log, the held-out prompts as token ids, and our engine's acceptance
on the same prompts for comparison."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the repository
SHIPPED = ROOT / "dspark/drafters/shipped"


def sh(cmd: list[str], log: Path) -> None:
    """Run `cmd` with its output in `log`; exit with the log's name when it fails."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as fh:
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        sys.exit(f"failed ({rc}): {' '.join(cmd)}; see {log}")


def export_drafter(method: str, fmt: str, out: Path, log: Path, drafter: Path | None = None,
                   model: str = "default") -> Path:
    """`dspark export` of the shipped drafter `method` (or the drafter directory
    `drafter`, trained for the target `model`) in format `fmt` (fp32)."""
    sh([sys.executable, "-m", "dspark.cli.main", "export", str(drafter or SHIPPED / method), "--to", fmt, str(out),
        "--dtype", "fp32", "--model", model], log)
    return out


def load_target_and_prompts(dtype: str, threads: int, num_prompts: int, model: str = "default"):
    """The target `model` (default: the embedded one) in `dtype` and `num_prompts` mixed
    held-out chat prompts as token ids."""
    import torch

    from dspark.bench.dataset import heldout_prompts
    from dspark.runtime.target import Target

    torch.set_num_threads(threads)
    target = Target.load(model, dtype=dtype, max_len=2048)
    prompts = [target.tokenizer.apply_chat_template(p.chat_messages())
               for p in heldout_prompts("mixed", num_prompts)]
    return target, prompts


def our_acceptance(target, method: str, block: int, prompts: list[list[int]], max_tokens: int,
                   drafter: Path | None = None) -> dict:
    """Our engine's acceptance with the shipped drafter (or `drafter`), every drafted
    token verified."""
    from dspark.eval.acceptance import measure_acceptance

    ours = measure_acceptance(target, drafter or SHIPPED / method, block, prompts, max_tokens=max_tokens)
    return {"tau": ours.acceptance_length, "per_position": ours.per_position,
            "acceptance_rate": (ours.acceptance_length - 1) / ours.block,  # accepted per drafted token
            "rounds": ours.rounds, "tokens": ours.output_tokens}


def print_table(rows: list[dict], engine_key: str, engine_name: str) -> None:
    print(f"| method | greedy = plain | {engine_name} acceptance | dspark acceptance | ratio | dspark tau |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['method']} | – | {r['error'][:60]} | | | |")
            continue
        rate, peer = r["dspark"]["acceptance_rate"], r[engine_key]["acceptance_rate"]
        print(f"| {r['method']} | {r['greedy_equal_to_plain']}/{r['prompts']} | {peer:.3f} | {rate:.3f} | "
              f"{peer / max(rate, 1e-9):.2f} | {r['dspark']['tau']:.2f} |")
