"""Serving throughput with the live dashboard open and closed, side by side.

Usage: python scripts/dev/bench_dashboard_overhead.py --url http://127.0.0.1:8000 [--api-key KEY]
           [--rounds 6] [--concurrency 4] [--requests 16] [--max-tokens 64] [--pages 1]

Against a running `dspark serve` (start it first, on an otherwise quiet machine),
runs rounds of the same closed-loop load (`--concurrency` clients, `--requests`
greedy completions of `--max-tokens` tokens each, `ignore_eos`), alternating rounds
with `--pages` headless Chromium pages on the dashboard (polling once a second, as a
person watching would) and rounds with no page open; the first round of each kind
goes first in turn, so drift of the machine falls on both. Prints each round's
output tokens/s and the medians, and the ratio open/closed. Needs Debian's Chromium
(`apt-get install chromium`) and Playwright (`pip install playwright`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
PROMPT = "Write a detailed explanation of how a hash map works, with an example in Python."


def load_round(url: str, headers: dict, concurrency: int, requests: int, max_tokens: int) -> float:
    """Output tokens per second of one round of closed-loop load."""
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}

    def one(_: int) -> int:
        r = httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=600)
        r.raise_for_status()
        return r.json()["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(one, range(requests)))
    return tokens / (time.perf_counter() - t0)


def open_pages(browser, url: str, key: str | None, n: int) -> list:
    pages = []
    for _ in range(n):
        page = browser.new_page()
        page.goto(url + "/")
        if key:
            page.wait_for_selector("#key-box:not([hidden])")
            page.fill("#key-input", key)
            page.click("#key-form button")
        page.wait_for_function("Number(document.body.dataset.updates || 0) >= 1", timeout=30_000)
        pages.append(page)
    return pages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--rounds", type=int, default=6, help="rounds of each kind (open, closed)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--requests", type=int, default=16, help="requests per round")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--pages", type=int, default=1, help="dashboard pages open during the 'open' rounds")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args()
    if min(args.rounds, args.concurrency, args.requests, args.max_tokens, args.pages) < 1:
        sys.exit("--rounds, --concurrency, --requests, --max-tokens and --pages must be positive")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sys.exit("Playwright is missing: pip install playwright (and apt-get install chromium)")
    url = args.url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        httpx.get(url + "/health", timeout=10).raise_for_status()
    except httpx.HTTPError as e:
        sys.exit(f"no ready server at {url} ({e}); start `dspark serve` first")
    load_round(url, headers, args.concurrency, args.concurrency, args.max_tokens)  # warm-up
    results: dict[str, list[float]] = {"open": [], "closed": []}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
        for i in range(args.rounds):
            for kind in (("open", "closed") if i % 2 == 0 else ("closed", "open")):
                pages = open_pages(browser, url, args.api_key, args.pages) if kind == "open" else []
                tps = load_round(url, headers, args.concurrency, args.requests, args.max_tokens)
                if pages:
                    updates = min(int(pg.evaluate("Number(document.body.dataset.updates)")) for pg in pages)
                    for pg in pages:
                        pg.close()
                    note = f" (page updated {updates} times)"
                else:
                    note = ""
                results[kind].append(tps)
                print(f"round {i + 1} {kind:6s}: {tps:8.2f} output tok/s{note}", flush=True)
        browser.close()
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"median, dashboard open:   {med['open']:.2f} tok/s over {args.rounds} rounds")
    print(f"median, dashboard closed: {med['closed']:.2f} tok/s over {args.rounds} rounds")
    print(f"open / closed: {med['open'] / med['closed']:.3f}")


if __name__ == "__main__":
    main()
