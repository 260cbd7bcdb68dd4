"""How many bits the activations need for greedy output to stay the file's fp32 model's:
transformers fp32 on a GGUF's dequantized weights, with every linear's input rounded
per block of 32 as an integer-activation kernel would (scale = max |x| / L, x = scale *
round(x / scale)), against the same model in plain fp32. A simulation (torch, no native
kernel): it tells what an int8-activation precision (`q8x`, L = 127) costs in agreement,
and what a finer one would need, before any kernel is written.

    python3 scripts/dev/sim_activation_bits.py [MODEL_DIR] [--max-tokens 48]

MODEL_DIR: a converted model directory (default: the Qwen2.5-Coder file's, converted on
first use by `dspark generate --model FILE.gguf`). Variants: plain fp32; int8 everywhere
(L = 127); int8 but the output projection in fp32; int8 but the MLP's down projection at
~15 bits (L = 127 * 254: two int8 digits); ~15 bits everywhere. Prints, per variant, how
many of the prompts' greedy replies equal fp32's and where each first differs.
"""

from __future__ import annotations

import argparse
import glob
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from check_second_target import PROMPTS as SECOND_TARGET_PROMPTS  # noqa: E402

#: the second target's exactness prompts, and six more
PROMPTS = SECOND_TARGET_PROMPTS + [
    "Write a C function that returns the length of a null-terminated string.",
    "What is the derivative of x^3 + 2x? Explain briefly.",
    "Write a bash one-liner that counts lines in all .py files.",
    "Explain the difference between a list and a tuple in Python.",
    "Write a JavaScript function that debounces another function.",
    "How many seconds are there in a day? Show the calculation.",
]
TWO_DIGITS = 127.0 * 254
VARIANTS = {
    "fp32": {},
    "int8": {"*": 127.0},
    "int8, output fp32": {"*": 127.0, "lm_head": None},
    "int8, down ~15 bits": {"*": 127.0, "down_proj": TWO_DIGITS},
    "~15 bits": {"*": TWO_DIGITS},
}


def rounded(x: torch.Tensor, levels: float) -> torch.Tensor:
    """x rounded per block of 32 along its last dimension to `levels` steps of max |x|."""
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    a = blocks.abs().amax(-1, keepdim=True)
    inv = torch.where(a > 0, levels / a, torch.zeros_like(a))
    return (torch.round(blocks * inv) * (a / levels)).reshape(x.shape)


def main() -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dspark.runtime.cache import cache_root

    default = (glob.glob(str(cache_root() / "models" / "qwen2.5-coder-0.5b-instruct-*")) or [None])[0]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=default)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if not args.model:
        ap.error("no converted Qwen2.5-Coder model: run scripts/fetch_qwen_coder.sh, then dspark generate --model it")
    torch.set_num_threads(args.threads)
    from dspark.runtime.gguf_convert import ensure_dense

    ensure_dense(Path(args.model))  # a converted GGUF's linears may be held as blocks only
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    mode: dict[str, float | None] = {}

    def hook(kind: str):
        def pre(module, inputs):
            levels = mode.get(kind, mode.get("*"))
            return None if levels is None else (rounded(inputs[0], levels),)
        return pre

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_pre_hook(hook(name.rsplit(".", 1)[-1]))
    ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
           for p in PROMPTS]
    ids = [i["input_ids"] if hasattr(i, "keys") else i for i in ids]
    reference = None
    for name, variant in VARIANTS.items():
        mode.clear()
        mode.update(variant)
        t0 = time.perf_counter()
        with torch.no_grad():
            outs = [model.generate(torch.tensor([i]), max_new_tokens=args.max_tokens, do_sample=False)[0, len(i):]
                    .tolist() for i in ids]
        reference = reference or outs
        same = sum(a == b for a, b in zip(outs, reference))
        first = [next((k for k, (u, v) in enumerate(zip(a, b)) if u != v), None) for a, b in zip(outs, reference)]
        print(f"{name:20s} {same}/{len(outs)} replies equal to fp32; first difference at token "
              f"{[f for f in first if f is not None] or '-'} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
