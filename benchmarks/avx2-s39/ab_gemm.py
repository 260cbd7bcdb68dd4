# Kernel A/B in one process: two builds of the bf16w matmul side by side, alternating
# (9 rounds), the default model's 4 layer shapes x 30 weight copies (streamed from memory;
# NCOPY=1 keeps one copy, in cache). python3 ab_gemm.py old,new 1,4,6,7,8,12,16
import ctypes, sys, time, statistics, torch
sys.path.insert(0, __import__("subprocess").check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip())
from dspark.runtime.cpu_kernels import PackedBf16
NCOPY = int(__import__("os").environ.get("NCOPY", "30"))
libs = {n: ctypes.CDLL(f"/tmp/ab/{n}.so") for n in sys.argv[1].split(",")}
rows = [int(x) for x in sys.argv[2].split(",")]
shapes = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
g = torch.Generator().manual_seed(0)
W = {k: [PackedBf16((torch.randn(n, kk, generator=g) * .05).to(torch.bfloat16)) for _ in range(30)] for k, (n, kk) in shapes.items()}
print("rows " + " ".join(f"{n:>18}" for n in libs) + "   (ms per step: the 4 shapes x 30 layers)")
for m in rows:
    xs = {k: torch.randn(m, kk, generator=g) for k, (n, kk) in shapes.items()}
    ys = {k: torch.empty(m, n) for k, (n, kk) in shapes.items()}
    res = {k: [] for k in libs}; outs = {}
    for r in range(9):
        for name, lib in libs.items():
            f = lib.dspark_gemm_bf16w_packed
            t = time.perf_counter()
            for rep in range(2):
                for l in range(30):
                    for k, (n, kk) in shapes.items():
                        f(ctypes.c_void_p(xs[k].data_ptr()), ctypes.c_void_p(W[k][l % NCOPY].data.data_ptr()), None, ctypes.c_void_p(ys[k].data_ptr()),
                          ctypes.c_int64(m), ctypes.c_int64(n), ctypes.c_int64(kk), ctypes.c_int(2))
            res[name].append((time.perf_counter() - t) / 2 * 1e3)
            outs[name] = {k: v.clone() for k, v in ys.items()}
    base = list(libs)[0]
    same = all(torch.equal(outs[n][k], outs[base][k]) for n in outs for k in shapes)
    print(f"{m:>4} " + " ".join(f"{statistics.median(v):>8.2f} ({statistics.median([a/b for a,b in zip(v,res[base])]):.2f}x)" for v in res.values()), "same bits" if same else "DIFFERENT BITS")
