"""GGUF files as models: dequantized once into a cached Hugging Face directory.

`--model FILE.gguf` (Llama, Qwen2 and Qwen3 architectures, any quantization the
installed `gguf` package can dequantize) is checked first (architecture, tensor
types) so a file that cannot be read gets a message saying why, then converted
through transformers + gguf to fp32 safetensors with its tokenizer and chat
template, in `<cache>/models/<name>-<digest>/` (the digest of the file's path, size
and modification time: a changed file is converted again). Every later use loads
that directory directly. The embedded default model is such a file too.

A quantized file's linears are also kept as stored (`quantized.write_quantized`): the
`gguf` precision, which `--dtype auto` picks for such a file, serves them through the
native kernel, each weight its exact dequantized value.
"""

from __future__ import annotations

import hashlib
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
    if name is None:
        st = path.stat()
        digest = hashlib.sha1(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:10]
        name = f"{path.stem}-{digest}"
    out = cache_root() / "models" / name
    if not ((out / "model.safetensors").is_file() and (out / "config.json").is_file()):
        arch = check_gguf(path)
        convert_gguf(path, out, _config_overrides(path, arch))
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


def convert_gguf(gguf: Path, out: Path, overrides: dict | None = None) -> None:
    """Dequantize `gguf` to an fp32 HF directory `out` (written aside, then renamed);
    `overrides`: config fields to set."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    print(f"[dspark] converting {gguf.name} to safetensors in {out} (first use only)...", flush=True)
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
                                                     **(overrides or {}))
        # transformers refuses save_pretrained on a GGUF-quantized model otherwise.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
    except (ValueError, KeyError, NotImplementedError, RuntimeError, OSError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise GgufError(f"cannot convert {gguf}: {type(e).__name__}: {e}") from None
    if out.exists():  # another process converted it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, out)
