"""Prefill speed: one request of N prompt tokens, the logits of its last row, our runtime
against llama.cpp's server on the same file (the same token ids, its prompt cache off).

    python3 scripts/dev/bench_prefill.py --model F.gguf [--dtype auto] [--tokens 256] [--repeats 5]
        [--llama-server .llama.cpp/build/bin/llama-server]

Prints the median milliseconds of each (llama.cpp: its own `prompt_ms`) and their ratio.
New random token ids every repeat, so no prefix is ever cached."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
import urllib.request

import torch


def ours(model: str, dtype: str, prompts: list[list[int]], threads: int) -> list[float]:
    from dspark.runtime.batch import FlatBatch
    from dspark.runtime.target import Target

    torch.set_num_threads(threads)
    t = Target.load(model, dtype=dtype, max_len=4096)
    out = []
    with torch.inference_mode():
        for i, ids in enumerate([prompts[0]] + prompts):  # the first one warms up
            cache = t.new_cache(1, 4096)
            batch = FlatBatch.from_requests([ids], [0], [cache.allocate(0)], device=t.device)
            t0 = time.perf_counter()
            t.model(batch, cache)
            if i:
                out.append((time.perf_counter() - t0) * 1e3)
    return out


def llama(server: str, model: str, prompts: list[list[int]], threads: int, port: int = 18777) -> list[float]:
    proc = subprocess.Popen([server, "-m", model, "-t", str(threads), "-tb", str(threads), "-np", "1", "-c", "4096",
                             "--no-warmup", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        else:
            raise SystemExit(f"{server} did not answer on port {port} within a minute")
        out = []
        for i, ids in enumerate([prompts[0]] + prompts):
            body = json.dumps({"prompt": ids, "n_predict": 1, "cache_prompt": False}).encode()
            req = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json"})
            timings = json.load(urllib.request.urlopen(req, timeout=600))["timings"]
            if i:
                out.append(timings["prompt_ms"])
        return out
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a GGUF file")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-server", default=".llama.cpp/build/bin/llama-server")
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 20000, (args.tokens,), generator=gen).tolist() for _ in range(args.repeats)]
    mine = statistics.median(ours(args.model, args.dtype, prompts, args.threads))
    theirs = statistics.median(llama(args.llama_server, args.model, prompts, args.threads))
    print(f"prefill of {args.tokens} tokens, median of {args.repeats}: ours ({args.dtype}) {mine:.1f} ms, "
          f"llama.cpp {theirs:.1f} ms: llama.cpp / ours {theirs / mine:.2f}")


if __name__ == "__main__":
    main()
