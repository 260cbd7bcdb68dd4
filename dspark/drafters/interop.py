"""Other projects' drafter checkpoint layouts: reading them into a `DrafterConfig` plus
a state dict in our names (`load_drafter` does this for any of them), and writing
ours out in them (`dspark.drafters.export`: `export_drafter`, `dspark export`).

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
