"""The bf16w kernel at 1-4 rows, before (e7373d0) and after this session's change to
its 2- and 3-row paths, called alternately on the same inputs; asserts the same bits.

    python3 benchmarks/avx2-s46/gemm_rows_ab.py
"""
import ctypes, statistics, subprocess, time
from pathlib import Path
import torch
from dspark.runtime import cpu_kernels as ck

here = Path(__file__).resolve().parents[2]
src = {"before": subprocess.run(["git", "show", "e7373d0:dspark/runtime/kernels/gemm_bf16w.c"], cwd=here,
                                capture_output=True, text=True, check=True).stdout,
       "after": (here / "dspark/runtime/kernels/gemm_bf16w.c").read_text()}
fns = {}
for name, text in src.items():
    c, so = Path(f"/tmp/gemm_{name}.c"), f"/tmp/gemm_{name}.so"
    c.write_text(text)
    subprocess.run(["cc", "-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", "-o", so, str(c)],
                   check=True)
    fn = ctypes.CDLL(so).dspark_gemm_bf16w_packed
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    fns[name] = fn
torch.manual_seed(0)
for K, N, what in [(576, 3072, "gate+up"), (1536, 576, "down"), (576, 960, "qkv"), (576, 49152, "LM head")]:
    p = ck.PackedBf16(torch.randn(N, K).to(torch.bfloat16))
    cells = []
    for M in (1, 2, 3, 4):
        x = torch.randn(M, K)
        ts, outs = {n: [] for n in fns}, {}
        for _ in range(400 if N < 10000 else 60):
            for n, fn in fns.items():
                y = torch.empty(M, N)
                t = time.perf_counter()
                fn(x.data_ptr(), p.data.data_ptr(), None, y.data_ptr(), M, N, K, torch.get_num_threads())
                ts[n].append(time.perf_counter() - t)
                outs[n] = y
        assert torch.equal(outs["before"], outs["after"]), "the two kernels differ"
        cells.append(f"M={M} {statistics.median(ts['before']) * 1e6:.0f} -> {statistics.median(ts['after']) * 1e6:.0f}")
    print(f"{what:8} [{K}x{N}] us: " + " | ".join(cells))
