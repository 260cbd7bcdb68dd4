"""Our drafters on llama.cpp's llama-server: conversion, greedy equality, acceptance.

For the default target and each shipped drafter (dspark, dflash, eagle3): export it
with `dspark export --to llama.cpp`, convert it (and the target, bf16) with llama.cpp's
own convert_hf_to_gguf.py, serve it with llama-server `--spec-type draft-<method>`,
send the same held-out prompts (as token ids, so both engines see the same prompt)
greedily, and check that the output equals llama-server's own plain output. Then
measure our engine's acceptance on the same prompts with the same drafter and block
(fixed verification of every drafted token) and put the two side by side.

    bash scripts/install_llama_cpp.sh           # once: llama.cpp source + llama-server
    dspark bench peers --engine llama.cpp [--num-prompts 12] [--max-tokens 64] \
        [--json runs/llama_cpp_interop.json]

Your own target and drafter: `--target FILE.gguf` (served by llama-server as it is,
loaded by our engine through its GGUF reader) and `--drafter DIR` (a trained drafter;
its method from its config), e.g. the second target:

    dspark bench peers --engine llama.cpp --target ~/.cache/dspark/gguf/qwen2.5-coder-0.5b-instruct.gguf \
        --drafter runs/qwen/train/dspark --work runs/llama_cpp_qwen

Acceptance rate = accepted draft tokens / drafted tokens over all prompts (llama-server
reports draft_n and draft_n_accepted per request); tau = generated tokens per target
forward (1 + accepted per round) on our side.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx
from .common import ROOT, export_drafter, load_target_and_prompts, our_acceptance, print_table, sh

SPEC_TYPES = {"dspark": "draft-dspark", "dflash": "draft-dflash", "eagle3": "draft-eagle3"}


def serve(llama: Path, args: list[str], port: int, log: Path):
    from dspark.bench.server_process import ServerProcess

    cmd = [str(llama / "build/bin/llama-server"), "--host", "127.0.0.1", "--port", str(port), *args]
    return ServerProcess(cmd, f"http://127.0.0.1:{port}", log, startup_timeout=300)


def complete(url: str, prompts: list[list[int]], max_tokens: int) -> list[dict]:
    out = []
    with httpx.Client(timeout=600) as client:
        for ids in prompts:
            r = client.post(url + "/completion", json={
                "prompt": ids, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "seed": 0,
                "return_tokens": True, "cache_prompt": False, "ignore_eos": True})
            r.raise_for_status()
            out.append(r.json())
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-dir", default=str(ROOT / ".llama.cpp"))
    ap.add_argument("--work", default=str(ROOT / "runs/llama_cpp"), help="GGUFs, exports and logs")
    ap.add_argument("--methods", default="dspark,dflash,eagle3")
    ap.add_argument("--target", default="default",
                    help="the target: default (the embedded model, converted to a bf16 GGUF) or a GGUF file")
    ap.add_argument("--drafter", default=None,
                    help="a trained drafter directory instead of the shipped ones (--methods is then its method)")
    ap.add_argument("--num-prompts", type=int, default=12, help="held-out prompts, mixed domains")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--block", type=int, default=7, help="drafted tokens per round (--spec-draft-n-max)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bf16w", help="our engine's precision (bf16 weights like the GGUF)")
    ap.add_argument("--port", type=int, default=8731)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    llama, work = Path(args.llama_dir), Path(args.work)
    if not (llama / "build/bin/llama-server").is_file():
        sys.exit(f"no llama-server under {llama}; run scripts/install_llama_cpp.sh first")
    work.mkdir(parents=True, exist_ok=True)

    from dspark.runtime.default_model import default_model_dir
    from dspark.runtime.gguf_convert import ensure_dense
    from dspark.runtime.gguf_model import gguf_model_dir

    drafter = Path(args.drafter) if args.drafter else None
    if drafter is not None:
        from dspark.drafters.checkpoint import read_config

        args.methods = read_config(drafter).method
    if args.target == "default":
        tdir = default_model_dir()
        target_gguf = work / "target-bf16.gguf"
        if not target_gguf.is_file():
            sh([sys.executable, str(llama / "convert_hf_to_gguf.py"), str(tdir), "--outtype", "bf16",
                "--outfile", str(target_gguf)], work / "convert-target.log")
    else:
        target_gguf = Path(args.target).expanduser()
        tdir = gguf_model_dir(target_gguf)  # the HF directory our engine reads it as
        ensure_dense(tdir)  # llama.cpp's converter reads it as a whole checkpoint
    target, prompts = load_target_and_prompts(args.dtype, args.threads, args.num_prompts, args.target)
    common = ["-m", str(target_gguf), "-t", str(args.threads), "-c", "4096", "-np", "1", "--no-warmup"]

    with serve(llama, common, args.port, work / "server-plain.log") as srv:
        plain = complete(srv.url, prompts, args.max_tokens)
    plain_tokens = [r.get("tokens") for r in plain]
    rows = []
    for method in args.methods.split(","):
        export = export_drafter(method, "llama.cpp", work / f"export-{method}", work / f"export-{method}.log", drafter,
                                args.target)
        draft_gguf = work / f"draft-{method}.gguf"
        sh([sys.executable, str(llama / "convert_hf_to_gguf.py"), str(export), "--target-model-dir", str(tdir),
            "--outtype", "bf16", "--outfile", str(draft_gguf)], work / f"convert-{method}.log")
        spec = ["-md", str(draft_gguf), "--spec-type", SPEC_TYPES[method], "--spec-draft-n-max", str(args.block),
                "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]
        t0 = time.perf_counter()
        try:
            with serve(llama, common + spec, args.port, work / f"server-{method}.log") as srv:
                got = complete(srv.url, prompts, args.max_tokens)
        except (httpx.HTTPError, RuntimeError, OSError) as e:  # a server that fails to start or dies
            rows.append({"method": method, "error": f"llama-server failed ({type(e).__name__}): see "
                                                    f"{work / f'server-{method}.log'}"})
            print(json.dumps(rows[-1]), flush=True)
            continue
        wall = time.perf_counter() - t0
        drafted = sum(r.get("timings", {}).get("draft_n", 0) for r in got)
        accepted = sum(r.get("timings", {}).get("draft_n_accepted", 0) for r in got)
        equal = sum(r.get("tokens") == p for r, p in zip(got, plain_tokens))
        rows.append({
            "method": method, "prompts": len(prompts), "greedy_equal_to_plain": equal,
            "llama_cpp": {"drafted": drafted, "accepted": accepted, "acceptance_rate": accepted / max(1, drafted)},
            "dspark": our_acceptance(target, method, args.block, prompts, args.max_tokens, drafter),
            "llama_cpp_wall_s": wall,
        })
        print(json.dumps(rows[-1]), flush=True)
    result = {"command": " ".join(sys.argv), "target": args.target, "drafter": args.drafter,
              "max_tokens": args.max_tokens, "block": args.block,
              "dtype": args.dtype, "threads": args.threads, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print_table(rows, "llama_cpp", "llama.cpp")

if __name__ == "__main__":
    main()
