"""A user's GGUF file written as the runtime reads it, one tensor at a time, without
building the model: the linears' blocks as stored (`quantized/blocks.safetensors`, the
`gguf` and `q8x` precisions read them in place) and every other tensor (embeddings,
norms, biases) dequantized to fp32 in `model.safetensors`. Converting a file so takes
about its own size in memory and on disk, where a whole fp32 checkpoint took ten times
it (a 491 MB Q4_K_M: 5.1 GB of memory and 2.9 GB of disk).

A precision that computes with dense weights (fp32, bf16w, bf16x), or a tool that reads
the directory as a Hugging Face checkpoint, first calls `ensure_dense`: the linears are
dequantized from the blocks (each weight exactly the file's value) into a complete
`model.safetensors`, once.

Every block tensor is checked at conversion against the `gguf` package's dequantization
of the same tensor, bit for bit (the values transformers builds from the file). A file
whose linears the kernel cannot read, or holds no quantized linear, is written dense.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from .quantized import (BLOCKS, QUANTIZED_FILE, QUANTIZED_NOTE, QUANTIZED_TYPES, TYPES, QuantError, QuantMatrix,
                        _llama_unpermute, hf_name, read_quantized)

#: GGUF names of a layer's tensors other than the linears' weights -> Hugging Face names
_LAYER_OTHERS = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
                 "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
                 "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
                 "attn_v.bias": "self_attn.v_proj.bias", "attn_output.bias": "self_attn.o_proj.bias"}


def hf_tensor_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor the runtime reads (None: one it does not,
    e.g. a Llama 3 file's `rope_freqs.weight`, which the config's rope scaling replaces)."""
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    linear = hf_name(gguf_name)
    if linear is not None:
        return linear
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_OTHERS:
        return f"model.layers.{parts[1]}.{_LAYER_OTHERS[parts[2]]}"
    return None


def _row_order(gguf_name: str, rows: int, cfg: dict) -> torch.Tensor | None:
    """A Llama file's q and k rows (weights and biases) in the checkpoint's order: the
    converter permuted them for its rotary layout, transformers permutes them back."""
    if cfg.get("model_type") != "llama" or not (".attn_q." in gguf_name or ".attn_k." in gguf_name):
        return None
    heads = cfg["num_attention_heads"]
    return _llama_unpermute(rows, heads if ".attn_q." in gguf_name else cfg.get("num_key_value_heads") or heads)


def _dequantized(t) -> np.ndarray:
    """A tensor's values in fp32, shaped [rows, columns] (or [n] for a vector)."""
    from gguf.quants import dequantize

    shape = tuple(int(n) for n in reversed(t.shape))
    out = np.asarray(dequantize(np.asarray(t.data), t.tensor_type), dtype=np.float32).reshape(shape)
    return out if out.flags.writeable else out.copy()  # an F32 tensor: the file's mapping, read-only


#: rows checked at a time (the check's memory: a few MB, not a tensor in fp32)
_CHECK_ROWS = 4096


def _check_blocks(file: str, t, qtype: str, raw: torch.Tensor, whole: torch.Tensor | None) -> None:
    """The kernel's values of `raw` (rows in the checkpoint's order) against the gguf
    package's dequantization of the same tensor, bit for bit: `whole` where the caller has
    it (in the checkpoint's order), else a few thousand rows at a time."""
    from gguf.quants import dequantize

    rows, k = raw.shape[0], int(t.shape[0])
    data = np.asarray(t.data).reshape(rows, -1)
    for r0 in range(0, rows, _CHECK_ROWS):
        r1 = min(rows, r0 + _CHECK_ROWS)
        want = whole[r0:r1] if whole is not None else torch.from_numpy(
            np.array(dequantize(data[r0:r1], t.tensor_type), dtype=np.float32).reshape(r1 - r0, k))
        got = QuantMatrix([(qtype, raw[r0:r1])], k).dequantize()
        if not torch.equal(got.view(torch.int32), want.contiguous().view(torch.int32)):
            raise QuantError(f"{file}: {t.name} dequantized here differs from the gguf package's "
                             "dequantization of the same blocks; serve it with --dtype fp32")


def write_checkpoint(gguf: Path, out: Path, cfg: dict) -> dict:
    """`out`'s model.safetensors and quantized/blocks.safetensors from `gguf` (config and
    tokenizer already in `out`); returns the note `quantized.QUANTIZED_NOTE` records."""
    from gguf import GGMLQuantizationType, GGUFReader
    from safetensors.torch import save_file

    from .cpu_kernels import load

    reader = GGUFReader(str(gguf))
    named = [(t, hf_tensor_name(t.name)) for t in reader.tensors]
    named = [(t, n) for t, n in named if n is not None]
    types = {t.name: GGMLQuantizationType(int(t.tensor_type)).name for t, _ in named}
    linears = [t for t, _ in named if hf_name(t.name)]
    unread = next((t for t in linears if types[t.name] not in TYPES), None)
    note: dict = {"types": {}}
    if unread is not None:
        note = {"unreadable": f"{gguf.name}: tensor {unread.name} is {types[unread.name]}, which dspark's gguf kernel "
                              f"cannot read (it reads {', '.join(TYPES)}); requantize the file with one of these "
                              "(e.g. llama-quantize ... Q4_K_M) or pass --dtype fp32 to dequantize it",
                "reads": list(TYPES)}
    as_blocks = unread is None and load() is not None and any(types[t.name] in QUANTIZED_TYPES for t in linears)
    dense: dict[str, torch.Tensor] = {}
    blocks: dict[str, torch.Tensor] = {}
    for t, name in named:
        shape = tuple(int(n) for n in reversed(t.shape))
        order = _row_order(t.name, shape[0], cfg)
        as_stored = as_blocks and hf_name(t.name) is not None
        # fp32 values: every tensor kept dense (the embedding too, beside its blocks), and a
        # Llama q/k whose rows are reordered (checked whole); the other linears never
        keep = not as_stored or name == "model.embed_tokens.weight"
        values = None
        if keep or order is not None:
            values = torch.from_numpy(_dequantized(t))
            values = (values[order] if order is not None else values).contiguous()
        if as_stored:
            raw = torch.from_numpy(np.array(t.data, copy=True).view(np.uint8).reshape(shape[0], -1))
            if order is not None:
                raw = raw[order].contiguous()
            _check_blocks(gguf.name, t, types[t.name], raw, values)
            blocks[name] = raw
            note["types"][types[t.name]] = note["types"].get(types[t.name], 0) + 1
        if keep:  # the others are served from their blocks; `ensure_dense` adds them where asked
            dense[name] = values
    save_file(dense, str(out / "model.safetensors"), metadata={"format": "pt"})
    if blocks:
        (out / QUANTIZED_FILE).parent.mkdir(exist_ok=True)
        save_file(blocks, str(out / QUANTIZED_FILE),
                  metadata={"types": json.dumps({n: types[t.name] for t, n in named if n in blocks}),
                            "source": gguf.name})
        note["dense"] = False
    (out / QUANTIZED_NOTE).write_text(json.dumps(note))
    return note


def ensure_dense(model_dir: Path) -> None:
    """Complete a checkpoint written without its linears' dense weights (`write_checkpoint`):
    they are dequantized from the blocks into `model.safetensors` (aside, then renamed), once.
    Any other directory is left as it is."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    model_dir = Path(model_dir)
    note_path = model_dir / QUANTIZED_NOTE
    try:
        note = json.loads(note_path.read_text())
    except (OSError, ValueError):
        return
    if note.get("dense", True):
        return
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as fh:
        state = {k: fh.get_tensor(k) for k in fh.keys()}
    for name, (qtype, raw) in read_quantized(model_dir).items():
        if name not in state:
            state[name] = QuantMatrix([(qtype, raw)], raw.shape[1] // BLOCKS[qtype][1] * BLOCKS[qtype][0]).dequantize()
    tmp = model_dir / f"model.safetensors.tmp{os.getpid()}"
    save_file(state, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, model_dir / "model.safetensors")
    note["dense"] = True
    tmp_note = note_path.with_name(note_path.name + f".tmp{os.getpid()}")
    tmp_note.write_text(json.dumps(note))
    os.replace(tmp_note, note_path)
