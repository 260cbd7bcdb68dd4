"""Our drafters written out in other projects' layouts (`dspark export`): deepspec and
llama.cpp's converter input, vLLM's speculators, SpecForge/vLLM EAGLE-3. The layouts
are described in `dspark.drafters.interop`, which reads them back."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import torch

from dspark.runtime.weight_formats import dense_weight

from .config import DrafterConfig, DrafterConfigError
from .interop import _HEAD_KEYS, EAGLE3_ARCHITECTURES, SPECULATORS_ARCHITECTURES, import_weights

EXPORT_FORMATS = ("deepspec", "speculators", "eagle3", "llama.cpp")


def export_drafter(drafter_dir: str | Path, fmt: str, out_dir: str | Path, target=None) -> Path:
    """Write the drafter checkpoint `drafter_dir` (any layout `load_drafter` reads) in
    layout `fmt` (deepspec, speculators, eagle3) to `out_dir`; returns it. `target` (a
    `Target` or `Transformer`) supplies the target's LM head rows (and embedding) that
    eagle3 and speculators ship and the verifier name speculators records; it is
    required for those two. calibration.json is copied along."""
    from .checkpoint import CALIBRATION_FILE, DrafterCheckpointError, _read_weights, read_layout
    from .target_parts import TargetParts

    src = Path(drafter_dir)
    if fmt not in EXPORT_FORMATS:
        raise DrafterCheckpointError(f"unknown export format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}")
    parts = TargetParts.of(target) if target is not None else None
    if parts is None and fmt not in ("deepspec", "llama.cpp"):
        raise DrafterCheckpointError(f"exporting to {fmt} needs the target (its LM head ships with the drafter)")
    layout, cfg = read_layout(src, parts.cfg.num_layers if parts is not None else None)
    if parts is not None:
        problems = cfg.check_target(parts.cfg)
        if problems:
            raise DrafterCheckpointError(f"{src} does not fit the target: " + "; ".join(problems))
    try:
        weights = import_weights(layout, _read_weights(src), cfg)
        weights.pop("embed_tokens.weight", None)  # the target's, shared
        if not cfg.reduced_vocab:
            weights.pop("lm_head.weight", None)
        config, weights = _EXPORTERS[fmt](cfg, weights, parts, target)
    except DrafterConfigError as e:
        raise DrafterCheckpointError(f"{src} cannot be exported to {fmt}: {e}") from None
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    if (src / CALIBRATION_FILE).is_file():
        shutil.copyfile(src / CALIBRATION_FILE, out / CALIBRATION_FILE)
    elif (out / CALIBRATION_FILE).exists():
        (out / CALIBRATION_FILE).unlink()
    return out


def export_caveats(drafter_dir: str | Path, fmt: str, target=None) -> list[str]:
    """What a known reader of layout `fmt` does not serve in the drafter at `drafter_dir`
    (the export itself is valid): warnings for the user, not errors, since another
    build or target architecture of that reader may serve it. `target` as for
    `export_drafter` (an external checkpoint may not say how many layers its target has)."""
    from .checkpoint import read_layout
    from .target_parts import TargetParts

    _, cfg = read_layout(Path(drafter_dir), TargetParts.of(target).cfg.num_layers if target is not None else None)
    notes = []
    last = cfg.num_target_layers - 1
    if fmt == "llama.cpp" and cfg.method in ("dspark", "dflash") and last in cfg.target_layer_ids:
        # llama-server (build 11434) reads tap i as the input of layer i + 1; its llama,
        # qwen2 and qwen3 graphs keep the inputs of layers 0..N-1 only
        notes.append(f"this drafter taps the target's last layer ({last}); llama.cpp reads a tap as the next "
                     f"layer's input, which its llama/qwen graphs do not keep past the last layer, so "
                     f"llama-server --spec-type draft-{cfg.method} aborts on it ('layer input tensor is null', "
                     f"build 11434). Serve it on vLLM or dspark, or move its taps below {last} and continue "
                     f"training it (`dspark train --init DIR --target-layer-ids ...`, each moved tap "
                     f"starting from the nearest old one's weights)")
    return notes


def _float_dtype(weights: dict[str, torch.Tensor]) -> torch.dtype:
    return next(w.dtype for w in weights.values() if w.is_floating_point())


def _draft_head(cfg: DrafterConfig, weights: dict, parts) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lm_head [draft vocab, H], d2t, t2d): the drafter's own, or for a full-vocabulary
    drafter the target's LM head with an identity mapping."""
    if cfg.reduced_vocab:
        return weights["lm_head.weight"], weights["d2t"], weights["t2d"]
    head = dense_weight(parts.lm_head).detach().to("cpu", _float_dtype(weights))
    return head, torch.zeros(cfg.vocab_size, dtype=torch.long), torch.ones(cfg.vocab_size, dtype=torch.bool)


def _need_qwen3_block(cfg: DrafterConfig, fmt: str) -> None:
    if cfg.method not in ("dspark", "dflash"):
        raise DrafterConfigError(f"{fmt} holds block drafters (dspark, dflash), not {cfg.method}")
    if cfg.model_type != "qwen3":
        raise DrafterConfigError(
            f"its layers are {cfg.model_type}-style, but the engines that read {fmt} build DSpark/DFlash drafters "
            "with Qwen3-style layers (q_norm/k_norm); train a new drafter (dspark creates block drafters "
            "Qwen3-style)")


def _to_deepspec(cfg: DrafterConfig, weights: dict, parts, target) -> tuple[dict, dict]:
    _need_qwen3_block(cfg, "deepspec")
    if cfg.method == "dflash" and cfg.sample_from_anchor:
        raise DrafterConfigError("DFlashDraftModel readers (llama.cpp, vLLM) draft the block [anchor, masks]; "
                                 "a DFlash drafter trained with sample_from_anchor has no deepspec reader")
    config = {
        **cfg.to_dict(),
        "sample_from_anchor": cfg.sample_from_anchor,
        "dspark_bonus_anchor": not cfg.sample_from_anchor,
        "enable_confidence_head": bool(cfg.enable_confidence_head),
        "draft_vocab_size": cfg.output_vocab_size,
        "layer_types": ["full_attention"] * cfg.num_hidden_layers,
        "use_sliding_window": False,
        "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids),
                          "block_size": cfg.block_size},
        "torch_dtype": str(_float_dtype(weights)).removeprefix("torch."),
    }
    return config, dict(weights)


def _to_llamacpp(cfg: DrafterConfig, weights: dict, parts, target) -> tuple[dict, dict]:
    """What llama.cpp's convert_hf_to_gguf.py reads for each method. DSpark: deepspec.
    Eagle3: eagle3. DFlash: through its DSpark reader (Qwen3DSparkModel without a Markov
    or confidence head, `markov_rank: 0`). Its DFlash reader writes neither the block
    convention (llama-server then assumes sample_from_anchor) nor a reduced
    vocabulary's d2t; the DSpark reader writes both, and the same runtime without a
    Markov head is DFlash (serve with --spec-type draft-dflash)."""
    if cfg.method == "eagle3":
        if parts is None:
            raise DrafterConfigError("an Eagle3 export needs the target (its LM head ships with the drafter)")
        return _to_eagle3(cfg, weights, parts, target)
    if cfg.method != "dflash":
        return _to_deepspec(cfg, weights, parts, target)
    _need_qwen3_block(cfg, "llama.cpp")
    config, weights = _to_deepspec(replace(cfg, sample_from_anchor=False), weights, parts, target)
    config.update(architectures=["Qwen3DSparkModel"], markov_rank=0, enable_confidence_head=False,
                  sample_from_anchor=cfg.sample_from_anchor, dspark_bonus_anchor=not cfg.sample_from_anchor)
    return config, weights


def _verifier(target) -> dict:
    path = getattr(target, "path", None)
    archs = []
    if path is not None and (Path(path) / "config.json").is_file():
        archs = json.loads((Path(path) / "config.json").read_text()).get("architectures") or []
    return {"name_or_path": str(path) if path is not None else None, "architectures": archs}


def _to_speculators(cfg: DrafterConfig, weights: dict, parts, target) -> tuple[dict, dict]:
    if cfg.method == "eagle3":
        if cfg.model_type not in ("llama", "qwen3") or cfg.attention_bias:
            raise DrafterConfigError(f"speculators' Eagle3 has llama or qwen3 layers without biases, not "
                                     f"{cfg.model_type}-style{' with biases' if cfg.attention_bias else ''}")
    else:
        _need_qwen3_block(cfg, "speculators")
        if cfg.method == "dspark" and cfg.markov_head_type == "rnn":
            raise DrafterConfigError("speculators' rnn Markov head (joint_proj) differs from dspark's")
    ours = cfg.to_dict()
    layer = {k: ours[k] for k in ("model_type", "hidden_act", "hidden_size", "intermediate_size", "num_hidden_layers",
                                  "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                                  "rope_theta", "rope_parameters", "max_position_embeddings", "attention_bias",
                                  "vocab_size", "tie_word_embeddings")}
    layer.update(rope_scaling=cfg.rope_scaling, layer_types=["full_attention"] * cfg.num_hidden_layers,
                 use_sliding_window=False)
    taps = [i + 1 for i in cfg.target_layer_ids]
    config = {
        "architectures": [next(a for a, m in SPECULATORS_ARCHITECTURES.items() if m == cfg.method)],
        "speculators_model_type": cfg.method,
        "speculators_config": {
            "algorithm": cfg.method,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": cfg.max_draft_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": _verifier(target),
        },
        "transformer_layer_config": layer,
        "draft_vocab_size": cfg.output_vocab_size,
        "target_hidden_size": parts.cfg.hidden_size,
        "block_size": cfg.block_size,
        "torch_dtype": str(_float_dtype(weights)).removeprefix("torch."),
    }
    out = {k: v for k, v in weights.items() if k not in ("d2t", "t2d")}
    head, d2t, t2d = _draft_head(cfg, weights, parts)
    out["lm_head.weight"] = head
    out["embed_tokens.weight"] = dense_weight(parts.embed_tokens).detach().to("cpu", _float_dtype(weights))
    if cfg.reduced_vocab:
        out["d2t"], out["t2d"] = d2t, t2d
    if cfg.method == "eagle3":
        config.update(eagle_aux_hidden_state_layer_ids=taps, norm_before_residual=False, norm_before_fc=False,
                      fc_norm=False, norm_output=False, embed_requires_grad=False)
        out["layers.0.hidden_norm.weight"] = out.pop("hidden_norm.weight")
    else:
        config.update(aux_hidden_state_layer_ids=taps, mask_token_id=cfg.mask_token_id,
                      sliding_window_non_causal=False, sample_from_anchor=cfg.sample_from_anchor)
        if cfg.method == "dspark":
            config.update({k: ours[k] for k in _HEAD_KEYS})
    return config, out


def _to_eagle3(cfg: DrafterConfig, weights: dict, parts, target) -> tuple[dict, dict]:
    if cfg.method != "eagle3":
        raise DrafterConfigError(f"the eagle3 layout holds Eagle3 drafters, not {cfg.method}")
    if cfg.model_type != "llama" or cfg.attention_bias:
        raise DrafterConfigError(f"LlamaForCausalLMEagle3 has a Llama layer without biases; this drafter's layer is "
                                 f"{cfg.model_type}-style{' with biases' if cfg.attention_bias else ''} "
                                 "(export it --to speculators)")
    if len(cfg.target_layer_ids) != 3:
        raise DrafterConfigError(f"LlamaForCausalLMEagle3 readers (vLLM, llama.cpp) tap exactly 3 target layers, "
                                 f"this drafter taps {len(cfg.target_layer_ids)}")
    ours = cfg.to_dict()
    config = {k: ours[k] for k in ("model_type", "hidden_act", "hidden_size", "intermediate_size", "num_hidden_layers",
                                   "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                                   "rope_theta", "max_position_embeddings", "attention_bias", "vocab_size",
                                   "tie_word_embeddings", "block_size")}
    config.update(
        architectures=[EAGLE3_ARCHITECTURES[0]], rope_scaling=cfg.rope_scaling, mlp_bias=False,
        draft_vocab_size=cfg.output_vocab_size, target_hidden_size=parts.cfg.hidden_size,
        eagle_aux_hidden_state_layer_ids=[i + 1 for i in cfg.target_layer_ids], norm_before_residual=False,
        torch_dtype=str(_float_dtype(weights)).removeprefix("torch."),
    )
    out = {}
    for name, w in weights.items():
        if name.startswith("layers.0."):
            out["midlayer." + name[len("layers.0."):]] = w
        elif name == "hidden_norm.weight":
            out["midlayer.hidden_norm.weight"] = w
        elif name not in ("lm_head.weight", "d2t", "t2d"):
            out[name] = w
    out["lm_head.weight"], out["d2t"], out["t2d"] = _draft_head(cfg, weights, parts)
    return config, out


_EXPORTERS = {"deepspec": _to_deepspec, "speculators": _to_speculators, "eagle3": _to_eagle3,
              "llama.cpp": _to_llamacpp}
