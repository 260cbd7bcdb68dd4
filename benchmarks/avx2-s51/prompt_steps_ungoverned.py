"""Each engine's prompt and decode steps: total, target forward, outside it, forward tokens.

    python3 benchmarks/avx2-s51/prompt_steps_ungoverned.py TRACE.jsonl
"""
import json, sys, statistics as st
rows=[json.loads(l) for l in open(sys.argv[1])]
name=next(r["engine"] for r in rows if r["engine"]!="plain")
for e in ("plain", name):
    for pre in (True, False):
        R=[r for r in rows if r["engine"]==e and r["prefill"]==pre]
        print(e, "prompt" if pre else "decode", len(R), "steps: total %.1f ms, target %.1f ms, outside %.2f ms, forward tokens %.1f, verify %.2f"%(
            1e3*st.mean(r["s"] for r in R), 1e3*st.mean(r["target_s"] for r in R), 1e3*st.mean(r["s"]-r["target_s"] for r in R), st.mean(r["forward_tokens"] for r in R), st.mean(r["verify"] for r in R)))
