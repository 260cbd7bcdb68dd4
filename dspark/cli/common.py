"""Flags shared by subcommands that load a target model."""

from __future__ import annotations

import argparse


def add_model_args(p: argparse.ArgumentParser) -> None:
    from dspark.engine.config import EngineConfig  # light: no torch

    g = p.add_argument_group("model")
    g.add_argument("--model", default="default",
                   help="Hugging Face model directory (config.json + safetensors), a GGUF file (Llama, Qwen2, Qwen3; "
                        "a quantized file is served as stored), or 'default' for the "
                        "embedded SmolLM2-135M-Instruct (a Q4_1 GGUF) (default: %(default)s)")
    g.add_argument("--dtype", default="auto", choices=["auto", "gguf", "q8x", "bf16", "fp16", "fp32", "bf16w", "bf16x"],
                   help="precision: gguf = a quantized GGUF file's blocks as stored (Q8_0, Q4_0/1, Q5_0/1, "
                        "Q2_K-Q6_K, IQ4_NL, IQ4_XS), every weight its exact value, fp32 compute; q8x = the same "
                        "blocks with the activations quantized to int8 per 32 weights (integer dot products, as "
                        "llama.cpp computes a quantized model: faster, not transformers' fp32 model); bf16w = bf16 "
                        "weights with fp32 compute (native AVX2/AVX-512 kernels); bf16x = bf16 weights with matmul "
                        "inputs rounded to bf16 and fp32 accumulation (AMX or avx512_bf16 kernels); bf16 on a "
                        "CPU = bf16x where the CPU has it, else bf16w; fp32 = a GGUF's dequantized values; "
                        "auto = q8x for a quantized GGUF file given as --model where its products measure faster than "
                        "gguf's (else gguf), bf16 on accelerators, else the fastest of "
                        "fp32 / bf16w / bf16x for this model by a short measurement at start-up (it says what "
                        "it picked). Every CPU precision is exact under speculation")
    g.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    g.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    g.add_argument("--max-model-len", type=int, default=EngineConfig.max_model_len,
                   help="maximum tokens per request, prompt + output (default: %(default)s)")


def load_target(args: argparse.Namespace):
    from dspark.runtime.target import Target

    return Target.load(args.model, dtype=args.dtype, device=args.device,
                       max_len=args.max_model_len, threads=args.threads)


def add_speculative_arg(p: argparse.ArgumentParser) -> None:
    """--speculative-config, with the same meaning in every command."""
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help='speculative decoding as JSON with vLLM key names, e.g. \'{"method": "ngram"}\' or '
                        '\'{"method": "dspark", "model": "DRAFTER_DIR", "enable_adaptive_verification": true}\'; '
                        "methods: dspark, dflash, eagle3, mtp, ngram (without \"model\", the drafter shipped for "
                        "the default model). 'none' = no speculation. Default (also in every other command): the "
                        "shipped DSpark drafter with prompt lookup (hybrid), adaptive verification and the "
                        "plain-decoding fallback from 8 running requests; for a target without a shipped "
                        "drafter, no speculation, with a warning")
