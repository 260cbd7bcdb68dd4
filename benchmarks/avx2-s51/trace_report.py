"""Reads governor_trace.py's JSON lines: plain decoding's decode-step time by stretch
of 100 steps and its fit to the context tokens; the governed engine's runs of each
mode against plain decoding's steps taken in the same rounds; and each engine's time
in prompt (prefill) steps against decode steps.

    python3 benchmarks/avx2-s51/trace_report.py TRACE.jsonl [...]
"""
import json
import statistics as st
import sys

import numpy as np

for path in sys.argv[1:]:
    rows = [json.loads(line) for line in open(path)]
    name = next(r["engine"] for r in rows if r["engine"] != "plain")
    print(f"== {path.split('/')[-1]}: plain against {name}")
    P = [r for r in rows if r["engine"] == "plain" and not r["prefill"] and r["n"]]
    G = [r for r in rows if r["engine"] == name and not r["prefill"] and r["n"]]
    for i in range(0, len(P), 100):
        b = P[i:i + 100]
        print(f"  plain steps {i:4d}-{i + len(b):4d}: context {st.mean(r['ctx'] for r in b):5.0f} tokens, "
              f"{1e3 * st.mean(r['s'] for r in b):.2f} ms/step")
    x = np.array([r["ctx"] for r in P], float)
    y = np.array([r["s"] for r in P]) * 1e3
    c = np.linalg.lstsq(np.vstack([np.ones_like(x), x]).T, y, rcond=None)[0]
    print(f"  plain ms/step = {c[0]:.2f} + {c[1]:.5f} x context tokens")
    runs = []
    for r in G:
        if not runs or runs[-1][0] != r["spec"]:
            runs.append((r["spec"], []))
        runs[-1][1].append(r)
    same = {r["round"]: r for r in P}
    for spec, rs in runs:
        pp = [same[r["round"]] for r in rs if r["round"] in same]
        g_s, g_e, g_n = sum(r["s"] for r in rs), sum(r["emitted"] for r in rs), sum(r["n"] for r in rs)
        p_s, p_e = sum(r["s"] for r in pp), sum(r["emitted"] for r in pp)
        ratio = (g_e / g_s) / (p_e / p_s) if p_s else float("nan")
        print(f"  {'speculative' if spec else 'plain mode '} {len(rs):4d} steps (rounds {rs[0]['round']}-{rs[-1]['round']}): "
              f"{g_e / g_n:.3f} tokens/request-step, tok/s x{ratio:.3f} plain decoding's in the same rounds")
    for e in (name, "plain"):
        R = [r for r in rows if r["engine"] == e]
        pre = [r for r in R if r["prefill"]]
        dec = [r for r in R if not r["prefill"]]
        print(f"  {e}: {len(pre)} prompt steps {sum(r['s'] for r in pre):.2f} s, {len(dec)} decode steps "
              f"{sum(r['s'] for r in dec):.2f} s")
