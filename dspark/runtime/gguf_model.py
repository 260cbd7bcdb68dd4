"""GGUF files as models: converted once into a cached Hugging Face directory.

`--model FILE.gguf` (Llama, Qwen2 and Qwen3 architectures, any quantization the
installed `gguf` package can dequantize) is checked first (architecture, tensor
types) so a file that cannot be read gets a message saying why, then converted into
`<cache>/models/<name>-<digest>/` (the digest of the file's path, size and
modification time: a changed file is converted again) with its config, tokenizer and
chat template. Every later use loads that directory directly.

A user's file is converted tensor by tensor (`gguf_convert`): the linears' blocks as
stored, which `--dtype auto` serves in place (the `gguf` or `q8x` precision), and the
other tensors in fp32; the linears are dequantized into the checkpoint only when a
precision or a tool needs them dense. The embedded default model, which tools read as
a whole checkpoint, is converted through transformers to fp32 and its blocks kept
beside it (`quantized.write_quantized`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from dspark.errors import UserError

#: GGUF `general.architecture` values the runtime implements
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")
_MAGIC = b"GGUF"


class GgufError(UserError, ValueError):
    pass


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == _MAGIC
    except OSError:
        return False


def check_gguf(path: Path) -> str:
    """The file's architecture, after checking that it and every tensor type can be
    read here; raises GgufError saying what cannot."""
    import numpy as np
    from gguf import GGUFReader, GGMLQuantizationType
    from gguf.quants import dequantize

    try:
        reader = GGUFReader(str(path))
    except Exception as e:  # truncated or not a GGUF file after all
        raise GgufError(f"cannot read {path} as GGUF: {e}") from None
    field = reader.fields.get("general.architecture")
    if field is None:
        raise GgufError(f"{path} has no general.architecture: not a model GGUF file")
    arch = bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GgufError(f"{path.name}: architecture {arch!r} is not supported; "
                        f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    tried: set[int] = set()
    for t in reader.tensors:
        qtype = int(t.tensor_type)
        if qtype in tried:
            continue
        tried.add(qtype)
        try:  # one row of each type: the installed gguf either dequantizes it or says it cannot
            dequantize(np.asarray(t.data).reshape(-1, t.data.shape[-1])[:1], t.tensor_type)
        except NotImplementedError:
            name = GGMLQuantizationType(qtype).name
            raise GgufError(f"{path.name}: tensor {t.name} is quantized as {name}, which the installed gguf "
                            "package cannot dequantize; convert the model with another quantization "
                            "(e.g. Q8_0, Q4_K_M) or upgrade gguf") from None
    return arch


def gguf_model_dir(path: str | Path, name: str | None = None) -> Path:
    """The cached HF directory of a GGUF file, converting it on first use. `name`: the
    directory's name (default: the file's stem and a digest of its identity)."""
    from .cache import cache_root

    path = Path(path).expanduser().resolve()
    user_file = name is None
    if user_file:
        st = path.stat()
        digest = hashlib.sha1(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:10]
        name = f"{path.stem}-{digest}"
    out = cache_root() / "models" / name
    if not ((out / "model.safetensors").is_file() and (out / "config.json").is_file()):
        arch = check_gguf(path)
        convert_gguf(path, out, _config_overrides(path, arch), lean=user_file)
    from .quantized import ensure_quantized

    ensure_quantized(path, out)  # a quantized file's blocks, served as stored (--dtype gguf)
    return out


def _config_overrides(path: Path, arch: str) -> dict:
    """Config fields transformers' GGUF reader leaves at their defaults: a Qwen3 head
    size other than 128 (`attention.key_length`) would otherwise not load."""
    from gguf import GGUFReader

    field = GGUFReader(str(path)).fields.get(f"{arch}.attention.key_length")
    if arch != "qwen3" or field is None:
        return {}
    return {"head_dim": int(field.parts[field.data[0]][0])}


def convert_gguf(gguf: Path, out: Path, overrides: dict | None = None, lean: bool = False) -> None:
    """`gguf` as an HF directory `out` (written aside, then renamed); `overrides`: config
    fields to set. `lean`: tensor by tensor, the linears kept as blocks where the kernel
    reads them (`gguf_convert.write_checkpoint`); else a whole fp32 checkpoint through
    transformers (the embedded default model, which tools read as a checkpoint)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from .quantized import QuantError

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    print(f"[dspark] converting {gguf.name} to safetensors in {out} (first use only)...", flush=True)
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        if lean:
            from .gguf_convert import write_checkpoint

            config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name, **(overrides or {}))
            config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
            config.dtype = torch.float32
            if hasattr(config, "quantization_config"):
                del config.quantization_config
            config.save_pretrained(str(tmp))
            GenerationConfig.from_model_config(config).save_pretrained(str(tmp))
            tok.save_pretrained(str(tmp))
            write_checkpoint(gguf, tmp, json.loads((tmp / "config.json").read_text()))
        else:
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
                                                         **(overrides or {}))
            # transformers refuses save_pretrained on a GGUF-quantized model otherwise.
            model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(str(tmp), safe_serialization=True)
            tok.save_pretrained(str(tmp))
    except QuantError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise GgufError(str(e)) from None
    except (ValueError, KeyError, NotImplementedError, RuntimeError, OSError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise GgufError(f"cannot convert {gguf}: {type(e).__name__}: {e}") from None
    if out.exists():  # another process converted it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, out)
