"""Load a Hugging Face model directory (config.json + safetensors) into `Transformer`.

Only safetensors are read: no pickle, no remote code. `--model default` (or no model)
resolves to the embedded SmolLM2-135M-Instruct, a GGUF file to its dequantized copy.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from dspark.errors import UserError

from .config import ConfigError, ModelConfig
from .precision import (_ALIASES, _COMPUTE, FP32_NOT_INVARIANT_NOTE, NOT_INVARIANT_WARNING, QUANTIZED_PRECISIONS,
                        _gguf_runs, cached_choose_precision, device_is_cpu, fp32_rows_invariant, parse_precision)
from .model import Transformer
from .weight_formats import (native_panels, pack_cpu_bf16_linears, skip_weight_init, use_bf16_weights, use_f32_panels,
                             use_quantized_weights)
from .prepared import PANELS, load_prepared, prepared_path, save_prepared


class ModelLoadError(UserError, ValueError):
    pass


def resolve_model_path(model: str | None) -> Path:
    """A `--model` value -> a Hugging Face model directory: 'default' (or nothing) is
    the embedded model, a GGUF file is dequantized once into the cache (`gguf_model`)."""
    if model in (None, "", "default"):
        from .default_model import default_model_dir

        return default_model_dir()
    p = Path(model).expanduser()
    if p.is_file():
        from .gguf_model import gguf_model_dir, is_gguf

        if is_gguf(p):
            return gguf_model_dir(p)
        raise ModelLoadError(f"model file {model!r} is not a GGUF file; pass a GGUF file, a Hugging Face "
                             "model directory (config.json + *.safetensors) or 'default'")
    if not p.is_dir():
        raise ModelLoadError(
            f"model path {model!r} is not a directory or a file; pass a Hugging Face model directory "
            "(config.json + *.safetensors), a GGUF file or 'default'"
        )
    return p


def _is_embedded_default(path: Path) -> bool:
    """The embedded default model's own checkpoint. Its weights ship as a Q4_1 file only
    to fit a package; `auto` measures its precision among bf16w, bf16x, fp32 and q8x on
    its own blocks (never gguf, whose multi-row steps and prefill run fp32 products: on a
    2-core avx512_bf16 EPYC bf16x ran the default configuration 1.33x gguf's speed; on a
    2-core AVX2 EPYC q8x ran it 1.44x bf16w's at one request and 1.10x at 16:
    docs/journal.md). `--dtype gguf` serves its file as stored; another file of it
    (`--model FILE.gguf`) is a user's file."""
    from .cache import cache_root
    from .default_model import DEFAULT_MODEL_NAME

    try:
        return Path(path).resolve() == (cache_root() / "models" / DEFAULT_MODEL_NAME).resolve()
    except OSError:
        return False


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def read_safetensors_dir(path: Path, error: type[Exception] = ModelLoadError,
                        skip: set[str] | frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
    """Every tensor of a directory's safetensors files (sharded via the index file
    when present), but those named in `skip` (never read). Raises `error` for a missing,
    corrupt or truncated file; never falls back to pickled formats."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = [path / n for n in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise error(f"{path} holds no *.safetensors file (pickled checkpoints are not loaded)")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                for k in fh.keys():
                    if k not in skip:
                        out[k] = fh.get_tensor(k)
        except Exception as e:  # corrupt or truncated file
            raise error(f"cannot read {f}: {e}") from None
    return out


def fuse_hf_state_dict(cfg: ModelConfig, sd: dict[str, torch.Tensor], linears: bool = True
                       ) -> dict[str, torch.Tensor]:
    """Map HF parameter names onto `Transformer`'s fused layout. `linears=False`: without
    the linears' weights (served from a file's blocks; `sd` need not hold them)."""

    def take(name: str) -> torch.Tensor:
        for key in (name, name.removeprefix("model.")):
            if key in sd:
                return sd[key]
        raise ModelLoadError(f"weight {name!r} missing from the checkpoint")

    out = {"embed_tokens.weight": take("model.embed_tokens.weight"), "norm.weight": take("model.norm.weight")}
    if linears and not cfg.tie_word_embeddings:
        out["lm_head.weight"] = sd.get("lm_head.weight", out["embed_tokens.weight"])
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        m = p + "mlp."
        if linears:
            out[f"layers.{i}.qkv_proj.weight"] = torch.cat(
                [take(a + "q_proj.weight"), take(a + "k_proj.weight"), take(a + "v_proj.weight")]
            )
            out[f"layers.{i}.o_proj.weight"] = take(a + "o_proj.weight")
            out[f"layers.{i}.gate_up_proj.weight"] = torch.cat(
                [take(m + "gate_proj.weight"), take(m + "up_proj.weight")])
            out[f"layers.{i}.down_proj.weight"] = take(m + "down_proj.weight")
        if cfg.qkv_bias:
            out[f"layers.{i}.qkv_proj.bias"] = torch.cat(
                [take(a + "q_proj.bias"), take(a + "k_proj.bias"), take(a + "v_proj.bias")]
            )
        if cfg.qk_norm:
            out[f"layers.{i}.q_norm.weight"] = take(a + "q_norm.weight")
            out[f"layers.{i}.k_norm.weight"] = take(a + "k_norm.weight")
        out[f"layers.{i}.input_layernorm.weight"] = take(p + "input_layernorm.weight")
        out[f"layers.{i}.post_attention_layernorm.weight"] = take(p + "post_attention_layernorm.weight")
    return out


def load_transformer(
    path: str | Path,
    dtype: torch.dtype | str = torch.float32,
    device: torch.device | str = "cpu",
    max_len: int | None = None,
    log=None,
) -> Transformer:
    """`dtype`: a torch dtype, or a precision name (PRECISIONS or "auto"; auto is
    measured on CPUs by `choose_precision`, once per machine and model shape, and `log`
    gets the line saying what it picked). On a CPU the runtime's layout of the
    checkpoint is cached (`prepared`): later loads map it instead of converting."""
    path = Path(path)
    try:
        cfg = ModelConfig.from_dir(path)
    except ConfigError as e:
        raise ModelLoadError(str(e)) from None
    precision = dtype if isinstance(dtype, str) else {v: k for k, v in _COMPUTE.items()
                                                      if k not in ("bf16w", "bf16x", *QUANTIZED_PRECISIONS)}[dtype]
    asked = precision
    precision = parse_precision(precision, device)
    if _ALIASES.get(asked, asked) == "bf16" and precision != "bf16" and log is not None:
        log(f"dtype bf16 on a CPU: {precision} (bf16 weights through the batch-invariant kernels; oneDNN's "
            "bf16 matmuls would let a token's logits depend on what shares its step)")
    from .quantized import (FIRST_MLP, choose_activations, describe, first_mlp_segments, has_quantized,
                            model_matrices, read_quantized)

    quantized = precision in ("auto", *QUANTIZED_PRECISIONS) and device_is_cpu(device) and has_quantized(path)
    blocks = None
    if precision == "auto" and quantized and _gguf_runs() and not _is_embedded_default(path):
        # a user's quantized file is served as stored, never rounded to another type
        blocks = read_quantized(path)
        precision, line = choose_activations(cfg, blocks)
        if log is not None:
            log(line)
    elif precision == "auto":
        # the embedded default model (a Q4_1 file): its blocks with int8 activations are
        # measured beside bf16w/bf16x/fp32 on its own first gate|up matrix
        own = first_mlp_segments(read_quantized(path, FIRST_MLP)) if quantized and _gguf_runs() else None
        precision, line = cached_choose_precision(cfg, q8x=own)
        if log is not None:
            log(line)
    if precision in QUANTIZED_PRECISIONS and not quantized:
        raise ModelLoadError(f"--dtype {precision} serves a quantized GGUF file's blocks; {path} was not made from one "
                             "(pass the .gguf file as --model, or choose another --dtype)")
    elif precision == "bf16" and torch.device(device).type == "cpu" and log is not None:
        log(NOT_INVARIANT_WARNING)
    device = torch.device(device)
    from . import cpu_kernels

    f32_panels = precision == "fp32" and device.type == "cpu" and cpu_kernels.available()
    if precision == "fp32" and device.type == "cpu" and not f32_panels and log is not None \
            and not fp32_rows_invariant(cfg.hidden_size):
        log(FP32_NOT_INVARIANT_NOTE)
    cache_file = prepared_path(path, precision) if device.type == "cpu" and precision not in QUANTIZED_PRECISIONS \
        else None
    tensors = load_prepared(cache_file)
    fresh = tensors is None
    matrices = None
    if precision in QUANTIZED_PRECISIONS:
        # the linears run from the file's blocks: their dequantized fp32 copies in the
        # checkpoint are never read (a linear's weight stays on the meta device and
        # `dense_weight` dequantizes it where one is asked for); the embedding table is
        # read from the checkpoint as a mapping, only its looked-up rows in memory
        blocks = blocks if blocks is not None else read_quantized(path)
        skip = set(blocks) - {"model.embed_tokens.weight"}
        matrices = model_matrices(cfg, blocks, int8_activations=precision == "q8x", consume=True)
        blocks = None
        tensors = fuse_hf_state_dict(cfg, read_safetensors_dir(path, skip=skip), linears=False)
        tensors = {k: v.to(device=device, dtype=_COMPUTE[precision]) for k, v in tensors.items()}
    elif fresh:
        from .gguf_convert import ensure_dense

        ensure_dense(path)  # a user's GGUF was converted with its linears as blocks only
        tensors = fuse_hf_state_dict(cfg, read_safetensors_dir(path))
    panels = {k.removesuffix(PANELS): tensors.pop(k) for k in [k for k in tensors if k.endswith(PANELS)]}
    with skip_weight_init(), torch.device("meta"):
        model = Transformer(cfg, max_len=1)
    model.load_state_dict(tensors, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    served = {f"{name}.weight" for name in matrices or ()}
    missing = [n for n, p in model.named_parameters() if p.is_meta and n not in served]
    if missing:
        raise ModelLoadError(f"weights missing from {path}: {missing[:5]}")
    model._rope_len = 0
    model.rope_cos = torch.empty(0)
    model.rope_sin = torch.empty(0)
    if fresh and matrices is None:  # a prepared file holds the final dtypes already (mixed, for bf16w and bf16x)
        model = model.to(device=device, dtype=_COMPUTE[precision])
    model.ensure_rope(max_len or min(cfg.max_position_embeddings, 4096))
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if matrices is not None:
        use_quantized_weights(model, matrices)
        if log is not None and precision == "gguf":
            log(f"dtype gguf: the file's blocks as stored, fp32 compute ({describe(matrices)}); "
                "--dtype q8x (int8 activations, as llama.cpp), bf16x or bf16w trade exactness to the file's "
                "model for speed (docs/how-it-works.md)")
        elif log is not None:
            from .cpu_matmul import q8x_form
            log(f"dtype q8x: the file's blocks as stored, activations quantized to int8 per 32, integer "
                f"products in {q8x_form() or 'avx2'} ({describe(matrices)}); batch-invariant: speculation "
                "gives exactly q8x's plain output")
    elif precision in ("bf16w", "bf16x"):
        use_bf16_weights(model, panels, kind=precision)
    elif f32_panels:
        use_f32_panels(model, panels)
    if fresh and cache_file is not None:
        state = {k: v for k, v in model.state_dict().items()
                 if not (cfg.tie_word_embeddings and k == "lm_head.weight")}
        state.update({name + PANELS: data for name, data in native_panels(model).items()})
        save_prepared(cache_file, state)
    pack_cpu_bf16_linears(model)
    return model
