"""Fuzz the HTTP API (`dspark.bench.fuzz`) and write what came back.

Without --base-url, an in-process server is started on 127.0.0.1 with n-gram
speculation, on a small random model that has the default model's tokenizer and
vocabulary: the same validation, tokenization, batching, speculation and streaming
as on the real model, fast enough for ten thousand cases on two cores.

    dspark bench fuzz --cases 10000 --seed 0 --out runs/fuzz_api.json
    dspark bench fuzz --base-url http://127.0.0.1:8000 --cases 500   # a running server
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", type=int, default=10000, help="cases to send (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="hypothesis seed: the same cases for the same seed")
    p.add_argument("--base-url", default=None, help="fuzz this running server instead of an in-process one")
    p.add_argument("--api-key", default=None, help="bearer key for --base-url")
    p.add_argument("--model-name", default=None, help="served model name for --base-url (default: from /v1/models)")
    p.add_argument("--concurrency", type=int, default=4, help="cases in flight (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before a case counts as a hang")
    p.add_argument("--out", default=None, help="write the report as JSON here")
    args = p.parse_args(argv)

    import httpx
    from tqdm import tqdm

    from dspark.bench.fuzz import draw_cases, run_cases

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        server = None
        if args.base_url is None:
            server, url, names = _in_process_server(Path(tmp))
        else:
            url = args.base_url.rstrip("/").removesuffix("/v1")
            names = [args.model_name] if args.model_name else [
                m["id"] for m in httpx.get(url + "/v1/models", headers={"authorization": f"Bearer {args.api_key}"}
                                           if args.api_key else {}, timeout=30).json()["data"]]
        print(f"drawing {args.cases} cases (seed {args.seed})...", file=sys.stderr)
        cases = draw_cases(args.cases, args.seed, names)
        with tqdm(total=len(cases), desc="fuzzing", unit="case", file=sys.stderr) as bar:
            report = run_cases(url, cases, args.api_key, args.concurrency, args.timeout, bar.update)
        if server is not None:
            server.stop()
    summary = report.summary()
    summary["setup"] = {"seed": args.seed, "concurrency": args.concurrency, "timeout_s": args.timeout,
                        "server": args.base_url or "in-process dspark serve, n-gram speculation, small random "
                                                   "model with the default tokenizer, max_model_len 64",
                        "python": platform.python_version(), "wall_s": round(time.monotonic() - t0, 1),
                        "command": "python " + " ".join(sys.argv)}
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if report.ok else 1


def _in_process_server(tmp: Path):
    from dspark.bench.fuzz import write_tiny_model
    from dspark.engine.engine import EngineConfig, LLMEngine
    from dspark.runtime.default_model import default_model_dir
    from dspark.runtime.target import Target
    from dspark.serve import ServeConfig, ServerThread, create_app
    from dspark.engine.config import SpeculativeConfig

    write_tiny_model(tmp / "tiny", default_model_dir())
    target = Target.load(str(tmp / "tiny"), dtype="fp32", device="cpu", max_len=64)
    engine = LLMEngine(target, SpeculativeConfig(method="ngram"),
                       EngineConfig(max_num_seqs=8, max_model_len=64, max_waiting=64))
    app = create_app(engine, ServeConfig(log_interval=0, served_model_names=["tiny"]))
    server = ServerThread(app).start()
    return server, server.url, ["tiny"]


if __name__ == "__main__":
    sys.exit(main())
