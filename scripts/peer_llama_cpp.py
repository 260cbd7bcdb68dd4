"""Our drafters on llama.cpp's llama-server: conversion, greedy equality, acceptance.

For the default target and each shipped drafter (dspark, dflash, eagle3): export it
with `dspark export --to llama.cpp`, convert it (and the target, bf16) with llama.cpp's
own convert_hf_to_gguf.py, serve it with llama-server `--spec-type draft-<method>`,
send the same held-out prompts (as token ids, so both engines see the same prompt)
greedily, and check that the output equals llama-server's own plain output. Then
measure our engine's acceptance on the same prompts with the same drafter and block
(fixed verification of every drafted token) and put the two side by side.

    bash scripts/install_llama_cpp.sh           # once: llama.cpp source + llama-server
    python scripts/peer_llama_cpp.py [--num-prompts 12] [--max-tokens 64] \
        [--json benchmarks/llama_cpp_interop.json]

Acceptance rate = accepted draft tokens / drafted tokens over all prompts (llama-server
reports draft_n and draft_n_accepted per request); tau = generated tokens per target
forward (1 + accepted per round) on our side.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
SPEC_TYPES = {"dspark": "draft-dspark", "dflash": "draft-dflash", "eagle3": "draft-eagle3"}


def sh(cmd: list[str], log: Path) -> None:
    with log.open("w") as fh:
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        sys.exit(f"failed ({rc}): {' '.join(cmd)}; see {log}")


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-dir", default=str(ROOT / ".llama.cpp"))
    ap.add_argument("--work", default=str(ROOT / "runs/llama_cpp"), help="GGUFs, exports and logs")
    ap.add_argument("--methods", default="dspark,dflash,eagle3")
    ap.add_argument("--num-prompts", type=int, default=12, help="held-out prompts, mixed domains")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--block", type=int, default=7, help="drafted tokens per round (--spec-draft-n-max)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bf16w", help="our engine's precision (bf16 weights like the GGUF)")
    ap.add_argument("--port", type=int, default=8731)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    llama, work = Path(args.llama_dir), Path(args.work)
    if not (llama / "build/bin/llama-server").is_file():
        sys.exit(f"no llama-server under {llama}; run scripts/install_llama_cpp.sh first")
    work.mkdir(parents=True, exist_ok=True)

    import torch

    from dspark.bench.dataset import heldout_prompts
    from dspark.eval.acceptance import measure_acceptance
    from dspark.runtime.default_model import default_model_dir
    from dspark.runtime.target import Target

    torch.set_num_threads(args.threads)
    tdir = default_model_dir()
    target_gguf = work / "target-bf16.gguf"
    if not target_gguf.is_file():
        sh([sys.executable, str(llama / "convert_hf_to_gguf.py"), str(tdir), "--outtype", "bf16",
            "--outfile", str(target_gguf)], work / "convert-target.log")
    target = Target.load("default", dtype=args.dtype, max_len=2048)
    prompts = [target.tokenizer.apply_chat_template(p.chat_messages())
               for p in heldout_prompts("mixed", args.num_prompts)]
    common = ["-m", str(target_gguf), "-t", str(args.threads), "-c", "4096", "-np", "1", "--no-warmup"]

    with serve(llama, common, args.port, work / "server-plain.log") as srv:
        plain = complete(srv.url, prompts, args.max_tokens)
    plain_tokens = [r.get("tokens") for r in plain]
    rows = []
    for method in args.methods.split(","):
        shipped = ROOT / "dspark/drafters/shipped" / method
        export = work / f"export-{method}"
        draft_gguf = work / f"draft-{method}.gguf"
        sh([sys.executable, "-m", "dspark.cli.main", "export", str(shipped), "--to", "llama.cpp", str(export),
            "--dtype", "fp32"], work / f"export-{method}.log")
        sh([sys.executable, str(llama / "convert_hf_to_gguf.py"), str(export), "--target-model-dir", str(tdir),
            "--outtype", "bf16", "--outfile", str(draft_gguf)], work / f"convert-{method}.log")
        spec = ["-md", str(draft_gguf), "--spec-type", SPEC_TYPES[method], "--spec-draft-n-max", str(args.block),
                "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]
        t0 = time.perf_counter()
        with serve(llama, common + spec, args.port, work / f"server-{method}.log") as srv:
            got = complete(srv.url, prompts, args.max_tokens)
        wall = time.perf_counter() - t0
        drafted = sum(r.get("timings", {}).get("draft_n", 0) for r in got)
        accepted = sum(r.get("timings", {}).get("draft_n_accepted", 0) for r in got)
        equal = sum(r.get("tokens") == p for r, p in zip(got, plain_tokens))
        ours = measure_acceptance(target, shipped, args.block, prompts, max_tokens=args.max_tokens)
        ours_rate = (ours.acceptance_length - 1) / ours.block  # accepted per drafted token
        rows.append({
            "method": method, "prompts": len(prompts), "greedy_equal_to_plain": equal,
            "llama_cpp": {"drafted": drafted, "accepted": accepted, "acceptance_rate": accepted / max(1, drafted)},
            "dspark": {"tau": ours.acceptance_length, "per_position": ours.per_position,
                       "acceptance_rate": ours_rate, "rounds": ours.rounds, "tokens": ours.output_tokens},
            "llama_cpp_wall_s": wall,
        })
        print(json.dumps(rows[-1]), flush=True)
    result = {"command": " ".join(sys.argv), "max_tokens": args.max_tokens, "block": args.block,
              "dtype": args.dtype, "threads": args.threads, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print("| method | greedy = plain | llama.cpp acceptance | dspark acceptance | ratio | dspark tau |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        rate = r["dspark"]["acceptance_rate"]
        print(f"| {r['method']} | {r['greedy_equal_to_plain']}/{r['prompts']} | "
              f"{r['llama_cpp']['acceptance_rate']:.3f} | {rate:.3f} | "
              f"{r['llama_cpp']['acceptance_rate'] / max(rate, 1e-9):.2f} | {r['dspark']['tau']:.2f} |")


if __name__ == "__main__":
    main()
