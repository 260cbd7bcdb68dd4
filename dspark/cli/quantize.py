"""`dspark quantize`: a quantized GGUF file of a model, without llama.cpp."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from dspark.runtime.gguf_quantize import TARGETS

    p = sub.add_parser(
        "quantize",
        help="write a model's GGUF file with its weight matrices in Q8_0, Q4_0, Q4_1, Q5_0 or Q5_1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Write MODEL (a GGUF file, or 'default': the embedded SmolLM2-135M-Instruct) to OUT with every\n"
            "weight matrix quantized to the type given, by the gguf package's quantizers (ggml's\n"
            "rounding); norms stay as they are, every metadata field is copied. `dspark serve --model OUT`\n"
            "then serves the file as stored (--dtype auto keeps its blocks: q8x where int8 activations\n"
            "measure faster on this CPU, else gguf, the file's exact fp32 model).\n\n"
            "K-quants (Q4_K_M, Q5_K_M, ...) need llama.cpp's llama-quantize:\n"
            "  bash scripts/install_llama_cpp.sh && cmake --build .llama.cpp/build --target llama-quantize\n"
            "  .llama.cpp/build/bin/llama-quantize IN.gguf OUT.gguf Q4_K_M"),
    )
    p.add_argument("out", metavar="OUT", help="the GGUF file to write")
    p.add_argument("--to", required=True, choices=list(TARGETS), help="the type of the weight matrices")
    p.add_argument("--model", default="default", help="a GGUF file, or 'default' (default: %(default)s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tqdm import tqdm

    from dspark.runtime.gguf_quantize import QuantizeError, quantize_gguf

    if args.model in ("", "default"):
        from dspark.runtime.default_model import default_gguf_path

        src = default_gguf_path()
    else:
        src = Path(args.model).expanduser()
        if not src.is_file():
            raise QuantizeError(f"--model {args.model!r} is not a file; pass a GGUF file or 'default'")
    out = Path(args.out).expanduser()
    if out.resolve() == src.resolve():
        raise QuantizeError("OUT is the source file; write to another path")
    bar = tqdm(total=None, unit="tensor", desc=f"quantizing to {args.to}")

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    counts = quantize_gguf(src, out, args.to, progress)
    bar.close()
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB; tensors: {kinds})")
    return 0
