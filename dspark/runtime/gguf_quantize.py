"""Quantized GGUF files without llama.cpp: `dspark quantize`.

Reads a GGUF file (any type the `gguf` package dequantizes), and writes a copy whose
weight matrices are stored as Q8_0, Q4_0, Q4_1, Q5_0 or Q5_1 (the types the `gguf`
package quantizes, with ggml's own rounding); norms and any matrix whose rows are not
whole 32-weight blocks stay as they were. Every metadata field (tokenizer, chat
template, hyper-parameters) is copied. K-quants (Q4_K_M, Q5_K_M, ...) need llama.cpp's
`llama-quantize` (scripts/install_llama_cpp.sh builds it beside llama-server).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from dspark.errors import UserError

#: `dspark quantize --to` -> (ggml type name, llama.cpp's file type id `general.file_type`)
TARGETS = {"q8_0": ("Q8_0", 7), "q4_0": ("Q4_0", 2), "q4_1": ("Q4_1", 3), "q5_0": ("Q5_0", 8),
           "q5_1": ("Q5_1", 9)}

#: fields the writer sets itself
_OWN_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", "general.architecture", "general.file_type")


class QuantizeError(UserError, ValueError):
    pass


def _is_matrix(name: str, shape) -> bool:
    return len(shape) == 2 and name.endswith(".weight") and "norm" not in name


def quantize_gguf(src: Path, out: Path, to: str, progress: Callable[[int, int], None] | None = None) -> dict:
    """Write `src` with its matrices in type `to` (a key of TARGETS) to `out` (written
    aside, then renamed). Returns counts of tensors by the type written."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize, quantize

    if to not in TARGETS:
        raise QuantizeError(f"cannot quantize to {to!r}; choose {', '.join(TARGETS)} "
                            "(K-quants: llama.cpp's llama-quantize)")
    qname, file_type = TARGETS[to]
    qtype = GGMLQuantizationType[qname]
    try:
        reader = GGUFReader(str(src))
    except Exception as e:
        raise QuantizeError(f"cannot read {src} as GGUF: {e}") from None
    field = reader.fields.get("general.architecture")
    if field is None:
        raise QuantizeError(f"{src} has no general.architecture: not a model GGUF file")
    arch = field.contents()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    writer = GGUFWriter(str(tmp), arch)
    for name, f in reader.fields.items():
        if name in _OWN_FIELDS:
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == GGUFValueType.ARRAY and len(f.types) > 1 else None
        writer.add_key_value(name, f.contents(), vtype, sub_type=sub)
    writer.add_file_type(file_type)
    counts: dict[str, int] = {}
    try:
        for i, t in enumerate(reader.tensors):
            shape = tuple(int(n) for n in reversed(t.shape.tolist()))  # rows, row length
            src_type = GGMLQuantizationType(int(t.tensor_type))
            if _is_matrix(t.name, shape) and shape[-1] % 32 == 0:
                values = dequantize(np.asarray(t.data), src_type).reshape(shape).astype(np.float32)
                writer.add_tensor(t.name, quantize(values, qtype), raw_dtype=qtype)
                kind = qname
            else:  # norms and odd shapes keep their type
                plain = src_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16)
                writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=None if plain else src_type)
                kind = src_type.name
            counts[kind] = counts.get(kind, 0) + 1
            if progress is not None:
                progress(i + 1, len(reader.tensors))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return counts
