"""Prompt (prefill) steps of the governed engine against plain decoding's k-th prompt step, by the mode they ran in.

    python3 benchmarks/avx2-s51/prompt_steps_by_mode.py TRACE.jsonl [...]
"""
import json, sys, statistics as st
for f in sys.argv[1:]:
    rows=[json.loads(l) for l in open(f)]
    name=next(r["engine"] for r in rows if r["engine"]!="plain")
    P=[r for r in rows if r["engine"]=="plain" and r["prefill"]]
    G=[r for r in rows if r["engine"]==name and r["prefill"]]
    if len(P)!=len(G): print(f, "unequal", len(P), len(G)); continue
    by={True:[],False:[]}
    for p,g in zip(P,G): by[g["spec"]].append((g["s"],p["s"],g["verify"],g["n"],p["n"]))
    for m,v in by.items():
        if v: print(f.split('/')[-1], "spec" if m else "plain", "prompt steps",len(v),"governed/plain time %.3f"%(sum(a for a,*_ in v)/sum(b for _,b,*_ in v)), "verify tokens/step %.1f"%st.mean(x[2] for x in v), "decodes riding %.1f vs %.1f"%(st.mean(x[3] for x in v), st.mean(x[4] for x in v)))
