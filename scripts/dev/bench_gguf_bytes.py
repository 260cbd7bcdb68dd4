"""Bytes read per decoded token in the gguf precision, against the machine's measured
memory bandwidth: for each GGUF type, one-row matmuls over distinct weights of some 200 MB
(so they stream from memory, as a model's do) with the type's repacked bytes per weight,
GB/s reached, and the fraction of a plain read of the same bytes (median of --passes, each
measuring the bandwidth then every type, and the range); then, for each model
file given, engine-alone decode at one request (plain, 96 tokens, 3 prompts) with its
bytes per token. Beside each: bf16x/bf16w over the same shapes.

    python3 scripts/dev/bench_gguf_bytes.py [--files A.gguf B.gguf ...] [--dtypes gguf,q8x] [--threads 2]

Prints one JSON object per line (type rows, then file rows), each with the commit and the
CPU flags that matter.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))


def machine() -> dict:
    from dspark.runtime.machine import cpu_flags

    flags = cpu_flags()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"commit": commit, "cpu_flags": sorted(f for f in flags if f in ("avx2", "avx512f", "avx512_bf16",
                                                                          "avx512_vnni", "amx_tile"))}


def read_bandwidth(nbytes: int = 512 << 20, repeats: int = 7) -> float:
    """GB/s of reading a buffer far larger than the caches (torch's threads): the best of
    an fp32 sum and a uint8 max over it (either alone can fall short of the memory's rate
    by a third on these machines)."""
    x = torch.ones(nbytes // 4)
    y = torch.ones(nbytes, dtype=torch.uint8)
    best = 1e9
    for _ in range(repeats):
        for fn in (x.sum, y.max):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def per_type(k: int, n: int, total: int, quant: list[str], passes: int) -> tuple[list[dict], list[float]]:
    """Each kind's rows (median over `passes` and [min-max]: each pass measures the read
    bandwidth, then every kind, the order reversed every other pass) and the bandwidths."""
    from test_quant_kernels import random_blocks

    from dspark.runtime.cpu_matmul import PackedBf16, PackedBf16Dot, bf16x_kernel, gemm_bf16w, gemm_bf16x
    from dspark.runtime.quantized import QuantMatrix, gemm_quant

    x = torch.randn(1, k)
    from dspark.runtime.quantized import NOT_Q8X

    kinds = [*quant, *(q + "/q8x" for q in quant if q not in NOT_Q8X), "bf16w"] + (["bf16x"] if bf16x_kernel() else [])
    lanes = {}
    for kind in kinds:
        if kind.startswith("bf16"):
            count = max(2, total // (2 * n * k))
            ws = [torch.randn(n, k).to(torch.bfloat16) for _ in range(count)]
            packed = [PackedBf16(w) if kind == "bf16w" else PackedBf16Dot(w) for w in ws]
            fn = gemm_bf16w if kind == "bf16w" else gemm_bf16x
            call = [lambda p=p: fn(x, p) for p in packed]
            nbytes = 2 * n * k * count
        else:
            qtype, int8 = kind.removesuffix("/q8x"), kind.endswith("/q8x")
            probe = QuantMatrix([(qtype, random_blocks(qtype, 16, k))], k)
            count = max(2, total // (probe.nbytes // 16 * n))
            mats = [QuantMatrix([(qtype, random_blocks(qtype, n, k, seed=i))], k, int8) for i in range(count)]
            call = [lambda m=m: gemm_quant(x, m) for m in mats]
            nbytes = sum(m.nbytes for m in mats)
        lanes[kind] = (call, nbytes, n * k * count, [])
    bws = []
    for i in range(passes):
        bws.append(read_bandwidth())
        for kind in (kinds if i % 2 == 0 else kinds[::-1]):
            call, nbytes, weights, seen = lanes[kind]
            best = 1e9
            for _ in range(3):
                t0 = time.perf_counter()
                for c in call:
                    c()
                best = min(best, time.perf_counter() - t0)
            seen.append((nbytes / best / 1e9, weights / best / 1e9, nbytes / best / 1e9 / bws[-1]))
    rows = []
    for kind, (_, nbytes, weights, seen) in lanes.items():
        gbs, wps, frac = (sorted(v[j] for v in seen) for j in range(3))
        rows.append({"kind": kind, "bytes_per_weight": round(nbytes / weights, 4),
                     "weights_per_s_g": round(statistics.median(wps), 2), "gb_per_s": round(statistics.median(gbs), 2),
                     "gb_per_s_range": [round(gbs[0], 2), round(gbs[-1], 2)],
                     "fraction_of_read_bandwidth": round(statistics.median(frac), 3),
                     "fraction_range": [round(frac[0], 3), round(frac[-1], 3)]})
    return rows, bws


def per_file(path: str, bw: float, dtype: str) -> dict:
    from dspark.generate import generate_plain
    from dspark.runtime.target import Target
    from dspark.sampling import SamplingParams

    target = Target.load(path, dtype=dtype, max_len=1024, log=lambda s: None)
    model = target.model
    nbytes = 0
    for mod in model.modules():
        fwd = mod.__dict__.get("forward")
        packed = getattr(fwd, "packed", None)
        if packed is not None:
            nbytes += getattr(packed, "nbytes", None) or packed.data.numel() * packed.data.element_size()
    prompts = ["Explain how a hash map works.", "Write a haiku about rain.", "What is 12 squared plus 7?"]
    rates = []
    for p in prompts:
        ids = target.tokenizer.chat_prompt(p)
        t0 = time.perf_counter()
        generate_plain(target, ids, SamplingParams(max_tokens=96, ignore_eos=True))
        rates.append(96 / (time.perf_counter() - t0))
    rate = sorted(rates)[1]
    return {"file": Path(path).name, "precision": target.precision, "linear_bytes_per_token_mb": round(nbytes / 1e6, 1),
            "decode_tok_s": round(rate, 1), "gb_per_s": round(nbytes * rate / 1e9, 2),
            "fraction_of_read_bandwidth": round(nbytes * rate / 1e9 / bw, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", nargs="*", default=[])
    ap.add_argument("--dtypes", default="auto", help="comma-separated precisions each file is decoded in")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--passes", type=int, default=3, help="passes over every kind (median and range)")
    ap.add_argument("--types", default=None,
                    help="comma-separated GGUF types (default: every quantized type the kernel reads)")
    ap.add_argument("--mb", type=int, default=200, help="weights streamed per measurement (MB)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    info = {**machine(), "threads": args.threads}
    from dspark.runtime.quantized import QUANTIZED_TYPES

    types = args.types.split(",") if args.types else list(QUANTIZED_TYPES)
    rows, bws = per_type(1536, 3072, args.mb << 20, types, args.passes)  # rows whole blocks of 256 for the K-types
    bw = statistics.median(bws)
    print(json.dumps({**info, "read_bandwidth_gb_s": round(bw, 2),
                      "read_bandwidth_range": [round(min(bws), 2), round(max(bws), 2)]}), flush=True)
    for row in rows:
        print(json.dumps({**info, "shape": "3072x1536", **row}), flush=True)
    for f in args.files:
        for dtype in args.dtypes.split(","):
            print(json.dumps({**info, **per_file(f, bw, dtype)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
