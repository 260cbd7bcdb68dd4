"""Drafter checkpoints: a directory with `config.json` (Hugging Face style, the public
DSpark release's field names, see `DrafterConfig`), `model.safetensors` and, after STS
calibration, `calibration.json` (`{"temperatures": [T_1, ..., T_γ]}`).

Weight names are the drafter's state-dict names (`layers.N.self_attn.q_proj.weight`,
`fc.weight`, `hidden_norm.weight`, `norm.weight`, `markov_head.markov_w1.weight`,
`confidence_head.proj.weight`, ...). The target's embedding and LM head are shared, so
they are never written; a checkpoint that carries them (the public release does) is
accepted when their shapes match the target, and they are ignored. A drafter with a
reduced draft vocabulary does write its own `lm_head.weight` [draft_vocab_size, H],
`d2t` (int64 offsets: draft index i is target id i + d2t[i]) and `t2d` (bool over the
target vocabulary).

`load_drafter` also reads the layouts of DeepSpec, speculators and SpecForge/vLLM
EAGLE-3 (see `interop`, which also writes them).

Only JSON and safetensors are read: no pickle, no remote code.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from dspark.errors import UserError
from dspark.runtime.loader import read_safetensors_dir

from .base import Drafter
from .config import DrafterConfig, DrafterConfigError
from .factory import build_drafter
from .interop import import_config, import_weights
from .target_parts import TargetParts

SHARED_WEIGHTS = ("embed_tokens.weight", "lm_head.weight")
CALIBRATION_FILE = "calibration.json"


class DrafterCheckpointError(UserError, ValueError):
    """A drafter checkpoint that is unreadable or does not fit the target."""


def save_drafter(drafter: Drafter, path: str | Path) -> Path:
    """Write `drafter` (a weighted drafter) as a checkpoint directory; returns the path."""
    config: DrafterConfig | None = getattr(drafter, "config", None)
    if config is None:
        raise DrafterCheckpointError(f"a {drafter.method or type(drafter).__name__} drafter has no weights to save")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items()}
    dtype = next((v.dtype for v in state.values() if v.is_floating_point()), torch.float32)
    cfg = {**config.to_dict(), "dtype": str(dtype).removeprefix("torch.")}
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    head = getattr(drafter, "confidence_head", None)
    calib = path / CALIBRATION_FILE
    if head is not None and head.calibrated:
        calib.write_text(json.dumps({"temperatures": head.temperatures}, indent=2) + "\n")
    elif calib.exists():
        calib.unlink()
    return path


def read_config_json(path: str | Path) -> dict:
    p = Path(path) / "config.json"
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError:
        raise DrafterCheckpointError(f"{p} not found: a drafter checkpoint directory needs config.json") from None
    except json.JSONDecodeError as e:
        raise DrafterCheckpointError(f"{p} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise DrafterCheckpointError(f"{p} must hold a JSON object")
    return raw


def read_layout(path: str | Path, target_num_layers: int | None = None) -> tuple[str, DrafterConfig]:
    """(layout, config) of a checkpoint directory in any layout `interop` reads."""
    raw = read_config_json(path)
    try:
        return import_config(raw, target_num_layers)
    except DrafterConfigError as e:
        raise DrafterCheckpointError(f"{Path(path) / 'config.json'}: {e}") from None


def read_config(path: str | Path) -> DrafterConfig:
    return read_layout(path)[1]


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    return read_safetensors_dir(path, DrafterCheckpointError)


def _read_calibration(path: Path) -> list[float] | None:
    p = path / CALIBRATION_FILE
    if not p.is_file():
        return None
    try:
        temps = json.loads(p.read_text())["temperatures"]
        return [float(t) for t in temps]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise DrafterCheckpointError(f"{p} must be {{\"temperatures\": [T_1, ..., T_gamma]}}: {e}") from None


def load_drafter(path: str | Path, target_model, dtype: torch.dtype | None = None) -> Drafter:
    """Load a drafter checkpoint for `target_model` (a `Transformer` or `Target`), on the
    target's device in `dtype` (default: the target's)."""
    path = Path(path)
    if not path.is_dir():
        raise DrafterCheckpointError(f"drafter checkpoint {str(path)!r} is not a directory")
    target = TargetParts.of(target_model)
    layout, config = read_layout(path, target.cfg.num_layers)
    problems = config.check_target(target.cfg)
    if problems:
        raise DrafterCheckpointError(f"{path} does not fit the target: " + "; ".join(problems))
    try:
        weights = import_weights(layout, _read_weights(path), config)
    except DrafterConfigError as e:
        raise DrafterCheckpointError(f"{path} ({layout} layout): {e}") from None
    want_shape = (target.cfg.vocab_size, target.cfg.hidden_size)
    for name in SHARED_WEIGHTS:
        if name == "lm_head.weight" and config.reduced_vocab:
            continue  # the drafter's own head over the reduced draft vocabulary
        w = weights.pop(name, None)
        if w is not None and tuple(w.shape) != want_shape:
            raise DrafterCheckpointError(
                f"{path}: {name} has shape {list(w.shape)} but the target's is {list(want_shape)}; "
                "the checkpoint was trained for another target"
            )
    with torch.device("meta"):
        drafter = build_drafter(config, target)
    expected = {k: tuple(v.shape) for k, v in drafter.state_dict().items()}
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing weights {missing[:6]}{' ...' if len(missing) > 6 else ''}")
        if extra:
            parts.append(f"unexpected weights {extra[:6]}{' ...' if len(extra) > 6 else ''}")
        raise DrafterCheckpointError(
            f"{path} does not match its config ({config.architecture}): " + "; ".join(parts)
        )
    bad = [f"{k} {list(weights[k].shape)} (expected {list(s)})" for k, s in expected.items() if tuple(weights[k].shape) != s]
    if bad:
        raise DrafterCheckpointError(f"{path}: weights of the wrong shape: {', '.join(bad[:6])}")
    dtype = dtype or target.dtype
    # Copies, not views of the file buffer: fresh (aligned) memory keeps kernels and
    # results identical to the drafter that was saved.
    state = {k: v.to(device=target.device, dtype=dtype if v.is_floating_point() else v.dtype, copy=True)
             for k, v in weights.items()}
    drafter.load_state_dict(state, strict=True, assign=True)
    temps = _read_calibration(path)
    if temps is not None:
        head = getattr(drafter, "confidence_head", None)
        if head is None:
            raise DrafterCheckpointError(f"{path} has {CALIBRATION_FILE} but the drafter has no confidence head")
        try:
            head.set_temperatures(temps)
        except ValueError as e:
            raise DrafterCheckpointError(f"{path / CALIBRATION_FILE}: {e}") from None
    return drafter.eval()
