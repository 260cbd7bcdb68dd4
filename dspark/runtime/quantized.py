"""A GGUF file's weights as stored: the `gguf` precision.

A quantized GGUF (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS
tensors, and F16, BF16, F32 ones beside them) is served with each linear's blocks read in
place by the native kernel (kernels/gemm_quant.c): every weight is exactly its dequantized fp32 value (the
value transformers builds from the file), activations and accumulation are fp32, and
each output is one fixed sequence of operations whatever else shares the step. So the
model served is the file's model, and speculative, batched and chunked decoding give
bit for bit what plain decoding gives.

- at conversion (`gguf_model.gguf_model_dir`), every linear's raw blocks go to
  `quantized/blocks.safetensors` under the Hugging Face names, rows in the checkpoint's
  order (a Llama file's q and k rows are permuted back as transformers does):
  `gguf_convert.write_checkpoint` for a user's file (checked against the `gguf` package's
  dequantization), `write_quantized` beside the embedded model's fp32 checkpoint
  (checked row by row against it);
- `QuantMatrix`: one linear's blocks (one segment per source tensor: a fused q|k|v
  projection is three, possibly of three types) and the kernel's descriptor;
- `use_quantized_weights`: switches a loaded model's linears to the kernel.
"""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path

import torch

from dspark.errors import UserError

from .cpu_kernels import load, why_unavailable

#: the file beside a converted checkpoint that holds its linears' blocks, and the note
#: that says whether there are any (or why they cannot be served)
QUANTIZED_FILE = "quantized/blocks.safetensors"  # in a folder: not among the checkpoint's *.safetensors
QUANTIZED_NOTE = "quantized.json"

#: ggml type ids the kernel reads (ggml.h `enum ggml_type`)
TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10, "Q3_K": 11, "Q4_K": 12,
         "Q5_K": 13, "Q6_K": 14, "IQ4_NL": 20, "IQ4_XS": 23, "BF16": 30}
TYPE_NAMES = {v: k for k, v in TYPES.items()}
#: (weights, bytes) per block
BLOCKS = {"F32": (32, 128), "F16": (32, 64), "BF16": (32, 64), "Q4_0": (32, 18), "Q4_1": (32, 20),
          "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34), "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144),
          "Q5_K": (256, 176), "Q6_K": (256, 210), "IQ4_NL": (32, 18), "IQ4_XS": (256, 136)}
QUANTIZED_TYPES = tuple(t for t in TYPES if t not in ("F32", "F16", "BF16"))
#: the quantized types q8x has no panel form for (the gguf precision reads them; the
#: kernel says so too: dspark_q8x_panel_type 0, checked against this by the tests)
NOT_Q8X = ("Q2_K",)
#: a repacked type's id plus this: the same bytes read with int8 activations (quant_units.h X_OFF - R_OFF)
_Q8X_OFFSET = 100

#: GGUF tensor names of a layer's linears -> the Hugging Face names
_LAYER_LINEARS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                  "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                  "ffn_down": "mlp.down_proj"}


class QuantError(UserError, ValueError):
    pass


def _lib():
    lib = load()
    if lib is None:
        raise RuntimeError(f"the gguf precision needs the native CPU kernels: {why_unavailable()}")
    return lib


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF linear's weight (None: not a linear)."""
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and parts[2] in _LAYER_LINEARS:
        return f"model.layers.{parts[1]}.{_LAYER_LINEARS[parts[2]]}.weight"
    return None


class QuantMatrix:
    """A weight [N, K] from a file's blocks: `segments` of (type name, uint8 [rows, row
    bytes] in the layout the kernel reads: repacked once here, see kernels/gemm_quant.c),
    stacked by rows. `data`: the kernel's descriptor (int64: segments, then per segment
    type, rows, row bytes, address), valid while this object lives. `int8_activations`:
    the `q8x` precision (kernels/gemm_q8x.c): the same blocks, the activations quantized
    to int8 per 32 (the descriptor's types say so; float segments compute as in gguf)."""

    def __init__(self, segments: list[tuple[str, torch.Tensor]], in_features: int,
                 int8_activations: bool = False) -> None:
        lib = _lib()
        self.int8_activations = int8_activations
        desc = [len(segments)]
        self.segments = []
        self.rows = []
        for name, blocks in segments:
            if name not in TYPES:
                raise QuantError(f"tensor type {name} is not one the gguf kernel reads ({', '.join(TYPES)})")
            per, nbytes = BLOCKS[name]
            if in_features % per or in_features % 16:
                raise QuantError(f"rows of {in_features} weights are not whole {name} blocks of {per}")
            blocks = blocks.detach().contiguous()
            if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != in_features // per * nbytes:
                raise QuantError(f"{name} blocks {tuple(blocks.shape)} do not hold rows of {in_features} weights")
            panel_kind = lib.dspark_q8x_panel_type(TYPES[name]) if int8_activations and name in QUANTIZED_TYPES \
                else None  # q8x: panels of 8 columns (gemm_q8x.c); the IQ4 types keep their 4-bit indices
            if panel_kind == 0:  # the kernel has no panel form for it (NOT_Q8X)
                raise QuantError(f"{name} blocks have no q8x form (a min per 16 weights); --dtype gguf reads them")
            kind = lib.dspark_quant_repacked_type(TYPES[name])
            row_bytes = ctypes.c_int64()
            per_repacked = lib.dspark_quant_block(kind, ctypes.byref(row_bytes))  # IQ4_NL/XS: R_Q8_0's 32
            rows = blocks.shape[0]
            packed = torch.empty(rows, in_features // per_repacked * row_bytes.value, dtype=torch.uint8)
            if rows:
                lib.dspark_quant_repack(TYPES[name], blocks.data_ptr(), blocks.shape[1], rows, in_features,
                                        packed.data_ptr())
            if panel_kind is not None:
                kind = panel_kind
                group = lib.dspark_q8x_group_bytes(kind, in_features)
                panel = torch.empty((rows + 7) // 8, group, dtype=torch.uint8)
                if rows:
                    lib.dspark_q8x_pack(kind, packed.data_ptr(), packed.shape[1], rows, in_features, panel.data_ptr())
                packed, kind = panel, kind + _Q8X_OFFSET
            self.segments.append((name, packed))
            self.rows.append(rows)
            desc += [kind, rows, packed.shape[1], packed.data_ptr()]
        self.data = torch.tensor(desc, dtype=torch.int64)
        self.in_features = in_features
        self.out_features = sum(self.rows)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for _, b in self.segments)

    def dequantize(self) -> torch.Tensor:
        """The exact fp32 weight [N, K]."""
        lib = _lib()
        out = torch.empty(self.out_features, self.in_features)
        row = 0
        for (name, blocks), rows, kind in zip(self.segments, self.rows, self.data[1::4].tolist()):
            if rows and kind > 2 * _Q8X_OFFSET:
                lib.dspark_q8x_dequant(kind - _Q8X_OFFSET, blocks.data_ptr(), rows, self.in_features,
                                       out[row].data_ptr())
            elif rows:
                lib.dspark_dequant_rows(kind, blocks.data_ptr(), blocks.shape[1], rows, self.in_features,
                                        out[row].data_ptr())
            row += rows
        return out


def gemm_quant(x: torch.Tensor, w: QuantMatrix, bias: torch.Tensor | None = None, reference: bool = False
               ) -> torch.Tensor:
    """x [..., K] fp32 times the blocks' weight [N, K] transposed (+ bias) -> [..., N]
    fp32. `reference`: the scalar reference (same bits, one element at a time)."""
    lib = _lib()
    if x.shape[-1] != w.in_features:
        raise ValueError(f"gemm_quant: input of {x.shape[-1]} features for a weight of {w.in_features}")
    rows = x.reshape(-1, w.in_features).to(torch.float32).contiguous()
    out = rows.new_empty(rows.shape[0], w.out_features)
    b = None if bias is None else bias.detach().to(torch.float32).contiguous()
    if rows.shape[0]:
        args = (rows.data_ptr(), w.data.data_ptr(), None if b is None else b.data_ptr(), out.data_ptr(),
                rows.shape[0], w.out_features, w.in_features)
        if reference:
            lib.dspark_gemm_quant_ref(*args)
        else:
            lib.dspark_gemm_quant(*args, torch.get_num_threads())
    return out.view(*x.shape[:-1], w.out_features)


# ---- conversion ------------------------------------------------------------------------

def _llama_unpermute(rows: int, heads: int) -> torch.Tensor:
    """The row order transformers gives a Llama GGUF's q or k weight (its GGUF reader
    undoes the converter's rotary permutation): checkpoint row i is file row order[i]."""
    dim = rows // heads // 2
    # the converter wrote checkpoint row (head, half, i) as file row (head, i, half)
    return torch.arange(rows).reshape(heads, dim, 2).transpose(1, 2).reshape(rows)


def write_quantized(gguf: Path, out_dir: Path) -> dict[str, int] | None:
    """Write the file's linears' blocks to `out_dir/quantized/blocks.safetensors`, rows in the
    order of the dequantized checkpoint already in `out_dir` (each tensor checked row by
    row against it: the kernel's values must be the checkpoint's bit for bit). Returns a
    count of tensors by type, or None (and writes nothing) where no linear is quantized
    or the kernels cannot run. Raises QuantError for a type the kernel cannot read."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader
    from safetensors import safe_open
    from safetensors.torch import save_file

    if load() is None:
        return None
    reader = GGUFReader(str(gguf))
    linears = [(t, hf_name(t.name)) for t in reader.tensors if hf_name(t.name)]
    types = {t.name: GGMLQuantizationType(int(t.tensor_type)).name for t, _ in linears}
    if not any(v in QUANTIZED_TYPES for v in types.values()):
        return None
    for t, _ in linears:
        if types[t.name] not in TYPES:
            raise QuantError(f"{gguf.name}: tensor {t.name} is {types[t.name]}, which dspark's gguf kernel cannot "
                             f"read (it reads {', '.join(TYPES)}); requantize the file with one of these "
                             "(e.g. llama-quantize ... Q4_K_M) or pass --dtype fp32 to dequantize it")
    cfg = json.loads((out_dir / "config.json").read_text())
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    arch = str(cfg.get("model_type", ""))
    blocks: dict[str, torch.Tensor] = {}
    meta: dict[str, str] = {}
    counts: dict[str, int] = {}
    with safe_open(str(out_dir / "model.safetensors"), framework="pt") as ref:
        keys = set(ref.keys())
        for t, name in linears:
            k = int(t.shape[0])
            rows = int(t.n_elements) // k
            raw = torch.from_numpy(np.ascontiguousarray(np.asarray(t.data)).view(np.uint8).reshape(rows, -1).copy())
            qm = QuantMatrix([(types[t.name], raw)], k)
            if name not in keys:
                raise QuantError(f"{gguf.name}: {t.name} ({name}) is not in the converted checkpoint")
            want = ref.get_tensor(name).to(torch.float32)
            got = qm.dequantize()
            if not torch.equal(got.view(torch.int32), want.view(torch.int32)):
                order = None
                if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
                    order = _llama_unpermute(rows, heads if name.endswith("q_proj.weight") else kv_heads)
                if order is None or not torch.equal(got[order].view(torch.int32), want.view(torch.int32)):
                    raise QuantError(f"{gguf.name}: {t.name} dequantized here differs from transformers' "
                                     "conversion of the same file; serve it with --dtype fp32")
                raw = raw[order].contiguous()
            blocks[name] = raw
            meta[name] = types[t.name]
            counts[types[t.name]] = counts.get(types[t.name], 0) + 1
    tmp = out_dir / f"{QUANTIZED_FILE}.tmp{os.getpid()}"
    tmp.parent.mkdir(exist_ok=True)
    save_file(blocks, str(tmp), metadata={"types": json.dumps(meta), "source": gguf.name})
    os.replace(tmp, out_dir / QUANTIZED_FILE)
    return counts


def read_quantized(model_dir: Path, names: list[str] | None = None) -> dict[str, tuple[str, torch.Tensor]]:
    """The blocks file of a converted checkpoint: HF name -> (type, blocks); only
    `names` (those the file has) where given."""
    from safetensors import safe_open

    with safe_open(str(Path(model_dir) / QUANTIZED_FILE), framework="pt") as fh:
        types = json.loads(fh.metadata()["types"])
        keys = fh.keys() if names is None else [k for k in names if k in types]
        return {k: (types[k], fh.get_tensor(k)) for k in keys}


#: the matrix `auto` measures a quantized file's precisions on: the first layer's gate|up
FIRST_MLP = ["model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"]


def first_mlp_segments(tensors: dict[str, tuple[str, torch.Tensor]]) -> list | None:
    """The first layer's gate|up blocks (QuantMatrix segments), or None where the file
    lacks them or keeps them in float types."""
    segs = [tensors.get(name) for name in FIRST_MLP]
    if any(s is None or s[0] not in QUANTIZED_TYPES for s in segs):
        return None
    return segs


def has_quantized(model_dir: Path) -> bool:
    """Whether the checkpoint was made from a quantized GGUF whose blocks the kernel
    serves (raises QuantError where that file holds a type the kernel cannot read: the
    caller asks only where the gguf precision would serve it)."""
    model_dir = Path(model_dir)
    try:
        note = json.loads((model_dir / QUANTIZED_NOTE).read_text())
    except (OSError, ValueError):
        note = {}
    if note.get("unreadable"):
        raise QuantError(note["unreadable"])
    return (model_dir / QUANTIZED_FILE).is_file()


def _stale(note: Path) -> bool:
    """Whether a checkpoint's note is missing, or refused a type this kernel reads now."""
    try:
        record = json.loads(note.read_text())
    except (OSError, ValueError):
        return True
    return bool(record.get("unreadable")) and record.get("reads") != list(TYPES)


def ensure_quantized(gguf: Path, out_dir: Path) -> None:
    """`write_quantized` once per converted checkpoint (its note says it was done), and
    again where the note refused the file with fewer readable types than there are now."""
    note = out_dir / QUANTIZED_NOTE
    if not _stale(note) or load() is None:
        return
    try:
        counts = write_quantized(gguf, out_dir)
        record = {"types": counts or {}}
    except QuantError as e:
        record = {"unreadable": str(e), "reads": list(TYPES)}
    tmp = note.with_name(note.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, note)


def model_matrices(cfg, tensors: dict[str, tuple[str, torch.Tensor]], int8_activations: bool = False,
                   consume: bool = False) -> dict[str, QuantMatrix]:
    """The runtime's linears (fused q|k|v and gate|up) as QuantMatrix, by module name
    (`int8_activations`: the q8x precision). `consume`: each tensor leaves `tensors` once
    repacked (the file's blocks and their repacking are never all in memory at once)."""
    def seg(name: str) -> tuple[str, torch.Tensor]:
        if name not in tensors:
            raise QuantError(f"{QUANTIZED_FILE} has no {name}")
        return tensors.pop(name) if consume else tensors[name]

    def mat(segments, k):
        return QuantMatrix(segments, k, int8_activations)

    k = cfg.hidden_size
    out = {}
    for i in range(cfg.num_layers):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        out[f"layers.{i}.qkv_proj"] = mat([seg(a + p + ".weight") for p in ("q_proj", "k_proj", "v_proj")], k)
        out[f"layers.{i}.o_proj"] = mat([seg(a + "o_proj.weight")], cfg.num_heads * cfg.head_dim)
        out[f"layers.{i}.gate_up_proj"] = mat([seg(m + "gate_proj.weight"), seg(m + "up_proj.weight")], k)
        out[f"layers.{i}.down_proj"] = mat([seg(m + "down_proj.weight")], cfg.intermediate_size)
    head = "lm_head.weight" if "lm_head.weight" in tensors else "model.embed_tokens.weight"
    out["lm_head"] = mat([seg(head)], k)
    return out


def describe(matrices: dict[str, QuantMatrix]) -> str:
    """Which linears run in which type, in one line."""
    count: dict[str, int] = {}
    nbytes = 0
    for qm in matrices.values():
        nbytes += qm.nbytes
        for name, _ in qm.segments:
            count[name] = count.get(name, 0) + 1
    kinds = ", ".join(f"{n} {c}" for n, c in sorted(count.items(), key=lambda kv: -kv[1]))
    return f"tensors by type: {kinds}; {nbytes / 2**20:.1f} MiB of linear weights read per token"


def choose_activations(cfg, tensors: dict[str, tuple[str, torch.Tensor]], repeats: int = 5) -> tuple[str, str]:
    """What `--dtype auto` serves a quantized file in: `q8x` (int8 activations) where its
    products measure faster than `gguf`'s on this model's first gate|up matrix, at 1 and
    at 8 rows (a decode step and a verification), else `gguf`. Returns the precision and
    the line that says why (a few tens of milliseconds; not cached: the kernels' ratio is
    large wherever both run)."""
    import time

    segs = first_mlp_segments(tensors)
    unread = sorted({t for t, _ in tensors.values() if t in NOT_Q8X})
    if unread:
        return "gguf", (f"dtype auto: gguf (the file's blocks as stored, fp32 activations; its {', '.join(unread)} "
                        "tensors have no q8x form)")
    if segs is None:
        return "gguf", "dtype auto: gguf (the file's blocks as stored, fp32 activations)"
    k = cfg.hidden_size
    mats = {"gguf": QuantMatrix(segs, k), "q8x": QuantMatrix(segs, k, int8_activations=True)}
    gen = torch.Generator().manual_seed(0)
    xs = {1: torch.randn(1, k, generator=gen), 8: torch.randn(8, k, generator=gen)}
    best = {(p, m): float("inf") for p in mats for m in xs}
    for _ in range(repeats):
        for (p, m) in best:
            calls = 8 if m == 1 else 2
            t0 = time.perf_counter()
            for _ in range(calls):
                gemm_quant(xs[m], mats[p])
            best[p, m] = min(best[p, m], (time.perf_counter() - t0) / calls)
    cost = {p: best[p, 1] + best[p, 8] for p in mats}
    pick = "q8x" if cost["q8x"] < cost["gguf"] else "gguf"
    times = ", ".join(f"{p} {1e3 * best[p, 1]:.2f}/{1e3 * best[p, 8]:.2f} ms" for p in mats)
    why = ("int8 activations, as llama.cpp computes; --dtype gguf serves the file's exact fp32 model"
           if pick == "q8x" else "fp32 activations: the file's exact model")
    return pick, f"dtype auto: {pick} ({why}; products of 1/8 rows: {times})"
