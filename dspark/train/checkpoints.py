"""Training checkpoints: `DIR/checkpoints/step-N/` holds a drafter checkpoint plus
`trainer_state.safetensors` (fp32 master weights and AdamW moments) and
`trainer_state.json` (step, schedule, evaluation bookkeeping, the run's config), enough
for `--resume` to continue exactly. A checkpoint is written aside and renamed, so a run
killed mid-save leaves the previous one whole; the newest `KEEP` are kept."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dspark.errors import UserError

KEEP = 2


def _step_of(path: Path) -> int:
    return int(path.name.split("-")[1])


def write_checkpoint(out: Path, step: int, drafter: torch.nn.Module, optimizer: torch.optim.Optimizer,
                     save_drafter, meta: dict) -> Path:
    """Write `out/checkpoints/step-{step}`: `save_drafter(dir)` writes the drafter, then
    the trainer state; `meta` joins the JSON. Returns the directory."""
    final = out / "checkpoints" / f"step-{step}"
    ckpt = final.with_name(f".partial-{final.name}")
    shutil.rmtree(ckpt, ignore_errors=True)
    save_drafter(ckpt)
    tensors: dict[str, torch.Tensor] = {}
    names = {p: n for n, p in drafter.named_parameters()}
    for n, p in drafter.named_parameters():
        tensors[f"master.{n}"] = p.detach().float().cpu().contiguous()
    adam_steps = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            st = optimizer.state.get(p)
            if st:
                tensors[f"exp_avg.{names[p]}"] = st["exp_avg"].cpu().contiguous()
                tensors[f"exp_avg_sq.{names[p]}"] = st["exp_avg_sq"].cpu().contiguous()
                adam_steps[names[p]] = float(st["step"])
    save_file(tensors, str(ckpt / "trainer_state.safetensors"))
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": step, "adam_steps": adam_steps, **meta},
                                                        indent=2) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    ckpt.rename(final)
    for p in sorted((out / "checkpoints").glob("step-*"), key=_step_of)[:-KEEP]:
        shutil.rmtree(p, ignore_errors=True)
    return final


def read_checkpoint(out: Path, drafter: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Load the newest checkpoint under `out/checkpoints` into the drafter's weights and
    the optimizer's moments; returns its JSON (with "step")."""
    found = sorted((out / "checkpoints").glob("step-*/trainer_state.json"), key=lambda p: _step_of(p.parent))
    if not found:
        raise UserError(f"--resume: no checkpoint under {out / 'checkpoints'}; start without --resume")
    meta = json.loads(found[-1].read_text())
    tensors = load_file(str(found[-1].parent / "trainer_state.safetensors"))
    params = dict(drafter.named_parameters())
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(tensors[f"master.{n}"])
    names = {p: n for n, p in params.items()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            n = names[p]
            if f"exp_avg.{n}" in tensors:
                optimizer.state[p] = {
                    "step": torch.tensor(meta["adam_steps"][n]),
                    "exp_avg": tensors[f"exp_avg.{n}"].to(p.device),
                    "exp_avg_sq": tensors[f"exp_avg_sq.{n}"].to(p.device),
                }
    return meta
