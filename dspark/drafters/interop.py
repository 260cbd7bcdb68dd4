"""Other projects' drafter checkpoint layouts: reading them into a `DrafterConfig` plus
a state dict in our names (`load_drafter` does this for any of them), and writing
ours out in them (`export_drafter`, `dspark export`).

Layouts (each a directory of `config.json` + `model.safetensors`):

  dspark       ours, DESIGN "Checkpoint format" (what `save_drafter` writes).
  deepspec     the public DSpark/DFlash releases: `Qwen3DSparkModel`, `DSparkDraftModel`,
               `DFlashDraftModel` (fields at the top level or nested under
               `dflash_config`/`dspark_config`); read by vLLM and llama.cpp's converter.
  speculators  vLLM's speculators library: `DSparkSpeculator`, `DFlashSpeculator`,
               `Eagle3Speculator`; the layer fields nested under `transformer_layer_config`
               (written as a diff against the transformers defaults of its model_type), tap
               ids in hidden-states numbering (`aux_hidden_state_layer_ids` /
               `eagle_aux_hidden_state_layer_ids` = our `target_layer_ids` + 1), the draft
               head `lm_head.weight` always present.
  eagle3       SpecForge / vLLM EAGLE-3: `LlamaForCausalLMEagle3`, `Eagle3LlamaForCausalLM`;
               the decoder layer as `midlayer.*` (its `hidden_norm` included), taps in
               `eagle_aux_hidden_state_layer_ids` (ours + 1), `lm_head` + `d2t` (+ `t2d`).

Which layout a config.json is in (`detect_layout`): speculators when it has
`speculators_model_type`, `transformer_layer_config` or `aux_hidden_state_layer_ids`
(SpecForge's flat DSpark export) or a `*Speculator` architecture; eagle3 for the EAGLE-3
architecture names; otherwise ours when every top-level key is one dspark writes
(`CONFIG_JSON_FIELDS` + `dtype`), else deepspec. A config written by transformers'
`save_pretrained` always carries keys of its own (`transformers_version`, `use_cache`,
...), so an external checkpoint is never mistaken for ours, and our older checkpoints
(`LlamaDSparkModel`, `LlamaDFlashModel`, `Qwen3DSparkModel` without
`sample_from_anchor`) keep loading with the block convention they were trained with.

`sample_from_anchor` (block convention) is never guessed for a deepspec checkpoint:
without it (or vLLM's `dspark_bonus_anchor`, its negation) the load fails naming it.
A speculators checkpoint without it predates that field, whose convention was the
bonus anchor (false), as llama.cpp's converter also assumes.

A full-vocabulary `lm_head`/`embed_tokens` inside an external checkpoint is taken to be
the target's (dspark shares the target's; the shapes are checked), as llama.cpp's
converter does.
"""

from __future__ import annotations

import json
from dataclasses import replace
import shutil
from pathlib import Path

import torch

from .config import (
    CONFIG_JSON_FIELDS,
    DEFAULT_BLOCK_SIZE,
    DrafterConfig,
    DrafterConfigError,
    architecture_name,
    parse_architecture,
)

LAYOUTS = ("dspark", "deepspec", "speculators", "eagle3")
EXPORT_FORMATS = ("deepspec", "speculators", "eagle3", "llama.cpp")
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
SPECULATORS_ARCHITECTURES = {"DSparkSpeculator": "dspark", "DFlashSpeculator": "dflash", "Eagle3Speculator": "eagle3"}
_OWN_KEYS = CONFIG_JSON_FIELDS | {"dtype"}
# HF decoder-layer fields copied between a speculators `transformer_layer_config` and ours
_LAYER_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings", "attention_bias",
               "rope_parameters", "rope_scaling", "use_sliding_window", "vocab_size")
_HEAD_KEYS = ("markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov")
# Options of other EAGLE-3 implementations that our Eagle3 layer does not compute.
_EAGLE3_UNSUPPORTED = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")

SAMPLE_FROM_ANCHOR_HELP = (
    "it decides what each block slot predicts and cannot be guessed: true = the DeepSpec convention "
    "(slot k predicts anchor+k+1, a block of block_size slots drafts block_size tokens); false = the "
    "DFlash/EAGLE convention (the block is [anchor, masks], slot k >= 1 predicts anchor+k, block_size-1 "
    "drafts; z-lab's DFlash releases use it). Read with the wrong one, acceptance silently drops to about 1. "
    "Add \"sample_from_anchor\": true or false to config.json"
)


# --- reading -------------------------------------------------------------------------


def _flatten(raw: dict, nested: tuple[str, ...]) -> dict:
    d = dict(raw)
    for key in nested:
        for k, v in (d.get(key) or {}).items():
            d.setdefault(k, v)
    return d


def detect_layout(raw: dict) -> str:
    """The layout of a parsed config.json (see the module docstring)."""
    arch = (raw.get("architectures") or [""])[0]
    if (arch in SPECULATORS_ARCHITECTURES or "speculators_model_type" in raw
            or "transformer_layer_config" in raw or "aux_hidden_state_layer_ids" in raw):
        return "speculators"
    if arch in EAGLE3_ARCHITECTURES:
        return "eagle3"
    return "dspark" if set(raw) <= _OWN_KEYS else "deepspec"


def import_config(raw: dict, target_num_layers: int | None = None) -> tuple[str, DrafterConfig]:
    """(layout, config) of a parsed config.json of any layout. `target_num_layers` fills
    `num_target_layers` where a layout does not record it (without it: the deepest tap + 1)."""
    layout = detect_layout(raw)
    if layout == "dspark":
        return layout, DrafterConfig.from_dict(raw)
    if layout == "deepspec":
        return layout, _deepspec_config(raw, target_num_layers)
    if layout == "speculators":
        return layout, _speculators_config(raw, target_num_layers)
    return layout, _eagle3_config(raw, target_num_layers)


def _block_convention(d: dict, default: bool | None) -> bool:
    if "sample_from_anchor" in d:
        return bool(d["sample_from_anchor"])
    if "dspark_bonus_anchor" in d:
        return not d["dspark_bonus_anchor"]
    if default is None:
        arch = (d.get("architectures") or ["?"])[0]
        raise DrafterConfigError(
            f"this {arch} checkpoint lacks the field 'sample_from_anchor': {SAMPLE_FROM_ANCHOR_HELP}")
    return default


def _deepspec_config(raw: dict, target_num_layers: int | None) -> DrafterConfig:
    d = _flatten(raw, ("dflash_config", "dspark_config"))
    method, model_type = parse_architecture((d.get("architectures") or [""])[0] or "?")
    if method == "dspark" and d.get("markov_rank") == 0 and not d.get("enable_confidence_head"):
        # a DSpark layout without its heads is DFlash (how `--to llama.cpp` writes DFlash)
        d["architectures"] = [architecture_name("dflash", model_type)]
        for k in _HEAD_KEYS:
            d.pop(k, None)
        method = "dflash"
    if method in ("dspark", "dflash"):
        d["sample_from_anchor"] = _block_convention(d, None)
    d.pop("dspark_bonus_anchor", None)
    if "num_target_layers" not in d and d.get("target_layer_ids"):
        d["num_target_layers"] = target_num_layers or max(d["target_layer_ids"]) + 1
    return DrafterConfig.from_dict(d)


def _layer_fields(tl: dict) -> dict:
    """Our layer fields from an HF layer config that may omit its model_type's defaults."""
    model_type = tl.get("model_type") or "qwen3"
    try:
        from transformers import AutoConfig

        full = {**AutoConfig.for_model(model_type).to_dict(), **tl}
    except (ImportError, ValueError):
        full = dict(tl)
    if "sliding_attention" in (full.get("layer_types") or []):
        raise DrafterConfigError("sliding-window drafter attention is not supported")
    out = {k: full[k] for k in _LAYER_KEYS if full.get(k) is not None}
    rope = full.get("rope_parameters") or {}
    out["rope_theta"] = full.get("rope_theta") or rope.get("rope_theta") or 10000.0
    out["model_type"] = model_type
    return out


def _default_eagle3_taps(num_layers: int | None) -> list[int]:
    if num_layers is None:
        raise DrafterConfigError("the checkpoint names no eagle_aux_hidden_state_layer_ids and the target is unknown")
    return [i - 1 for i in (2, num_layers // 2, num_layers - 3)]  # vLLM's default, hidden-states numbering


def _speculators_config(raw: dict, target_num_layers: int | None) -> DrafterConfig:
    arch = (raw.get("architectures") or [""])[0]
    method = raw.get("speculators_model_type") or SPECULATORS_ARCHITECTURES.get(arch)
    if method is None:  # SpecForge's flat DSpark/DFlash export
        method, _ = parse_architecture(arch or "?")
    if method not in ("dspark", "dflash", "eagle3"):
        raise DrafterConfigError(f"speculators model type {method!r} is not supported (dspark, dflash, eagle3 are)")
    layer = _layer_fields(raw.get("transformer_layer_config") or raw)
    d = {**layer, "architectures": [architecture_name(method, layer["model_type"])],
         "draft_vocab_size": raw.get("draft_vocab_size")}
    if method == "eagle3":
        bad = [k for k in _EAGLE3_UNSUPPORTED if raw.get(k)]
        if bad:
            raise DrafterConfigError(f"EAGLE-3 options {bad} are not supported by dspark's Eagle3 layer")
        ids = raw.get("eagle_aux_hidden_state_layer_ids")
        d["target_layer_ids"] = [i - 1 for i in ids] if ids else _default_eagle3_taps(target_num_layers)
        d["block_size"] = raw.get("block_size", DEFAULT_BLOCK_SIZE["eagle3"])
    else:
        ids = raw.get("aux_hidden_state_layer_ids") or raw.get("dflash_config", {}).get("target_layer_ids")
        if not ids:
            raise DrafterConfigError("the checkpoint names no aux_hidden_state_layer_ids (the tapped target layers)")
        d["target_layer_ids"] = [i - 1 for i in ids] if raw.get("aux_hidden_state_layer_ids") else list(ids)
        d.update(block_size=raw.get("block_size", DEFAULT_BLOCK_SIZE[method]), mask_token_id=raw.get("mask_token_id"),
                 sample_from_anchor=_block_convention(raw, False))
        if method == "dspark":
            d.update({k: raw[k] for k in _HEAD_KEYS if k in raw})
            if d.get("markov_head_type") == "rnn":
                raise DrafterConfigError("speculators' rnn Markov head (joint_proj) differs from dspark's; "
                                         "only vanilla and gated heads are read")
    d["num_target_layers"] = target_num_layers or max(d["target_layer_ids"]) + 1
    return DrafterConfig.from_dict(d)


def _eagle3_config(raw: dict, target_num_layers: int | None) -> DrafterConfig:
    d = _flatten(raw, ("eagle_config",))
    bad = [k for k in _EAGLE3_UNSUPPORTED if d.get(k)]
    if bad:
        raise DrafterConfigError(f"EAGLE-3 options {bad} are not supported by dspark's Eagle3 layer")
    if d.get("mlp_bias"):
        raise DrafterConfigError("an EAGLE-3 layer with mlp_bias is not supported")
    ids = d.get("eagle_aux_hidden_state_layer_ids")
    taps = [i - 1 for i in ids] if ids else _default_eagle3_taps(target_num_layers)
    keep = {k: d[k] for k in _LAYER_KEYS + ("rope_theta", "draft_vocab_size", "block_size") if d.get(k) is not None}
    return DrafterConfig.from_dict({
        **keep, "architectures": [architecture_name("eagle3", "llama")], "model_type": "llama",
        "target_layer_ids": taps, "num_target_layers": target_num_layers or max(taps) + 1,
    })


def import_weights(layout: str, weights: dict[str, torch.Tensor], config: DrafterConfig) -> dict[str, torch.Tensor]:
    """The state dict of an external checkpoint in our names (the shared embedding and
    full-vocabulary LM head are left for `load_drafter` to check and drop)."""
    if layout == "dspark":
        return weights
    out = {}
    for name, w in weights.items():
        name = name.removeprefix("model.")
        if name.startswith("midlayer."):
            name = "layers.0." + name[len("midlayer."):]
        if name == "layers.0.hidden_norm.weight" and config.method == "eagle3":
            name = "hidden_norm.weight"
        if name.startswith(("verifier_lm_head.", "verifier_norm.")):
            continue  # speculators' frozen copies of the target's
        out[name] = w
    d2t, t2d = out.pop("d2t", None), out.pop("t2d", None)
    if not config.reduced_vocab:
        if d2t is not None and d2t.any():
            raise DrafterConfigError("a full-vocabulary checkpoint whose d2t is not all zeros (a permuted vocabulary)")
        return out
    if d2t is None:
        raise DrafterConfigError(f"draft_vocab_size {config.draft_vocab_size} < vocab_size {config.vocab_size} "
                                 "but the checkpoint has no d2t tensor")
    d2t = d2t.long().flatten()
    ids = torch.arange(d2t.numel()) + d2t
    if d2t.numel() != config.draft_vocab_size or int(ids.min()) < 0 or int(ids.max()) >= config.vocab_size \
            or ids.unique().numel() != ids.numel():
        raise DrafterConfigError(f"d2t must map {config.draft_vocab_size} draft indices to distinct target ids "
                                 f"below {config.vocab_size}")
    mask = torch.zeros(config.vocab_size, dtype=torch.bool)
    mask[ids] = True
    if t2d is not None and not torch.equal(t2d.bool().flatten(), mask):
        raise DrafterConfigError("t2d disagrees with d2t")
    out["d2t"], out["t2d"] = d2t, mask
    return out


# --- writing -------------------------------------------------------------------------


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


def _float_dtype(weights: dict[str, torch.Tensor]) -> torch.dtype:
    return next(w.dtype for w in weights.values() if w.is_floating_point())


def _draft_head(cfg: DrafterConfig, weights: dict, parts) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lm_head [draft vocab, H], d2t, t2d): the drafter's own, or for a full-vocabulary
    drafter the target's LM head with an identity mapping."""
    if cfg.reduced_vocab:
        return weights["lm_head.weight"], weights["d2t"], weights["t2d"]
    head = parts.lm_head.weight.detach().to("cpu", _float_dtype(weights))
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
    out["embed_tokens.weight"] = parts.embed_tokens.weight.detach().to("cpu", _float_dtype(weights))
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
