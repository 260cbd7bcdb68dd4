"""Flags shared by subcommands that load a target model."""

from __future__ import annotations

import argparse


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default="default",
                   help="Hugging Face model directory (config.json + safetensors), or 'default' for the "
                        "embedded SmolLM2-135M-Instruct (default: %(default)s)")
    g.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"],
                   help="weights/activation dtype; auto = bf16 on CUDA and on CPUs with avx512_bf16, else fp32")
    g.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    g.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    g.add_argument("--max-model-len", type=int, default=2048,
                   help="maximum tokens per request, prompt + output (default: %(default)s)")


def load_target(args: argparse.Namespace):
    from dspark.runtime.target import Target

    return Target.load(args.model, dtype=args.dtype, device=args.device,
                       max_len=args.max_model_len, threads=args.threads)
