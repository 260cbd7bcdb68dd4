# Kernel A/B in one process: two builds of dspark/runtime/kernels loaded side by side,
# alternating call batches (15 rounds), 30 distinct layer caches. Build them first with
# ab_build.sh (REV old, WORK new), then: python3 ab_attention.py old,new CONTEXT 1,2,4,8,16
import ctypes, sys, time, statistics, torch
libs = {n: ctypes.CDLL(f"/tmp/ab/{n}.so") for n in sys.argv[1].split(",")}
ctx = int(sys.argv[2]); toks = [int(x) for x in sys.argv[3].split(",")]
H, KVH, D, LAYERS = 9, 3, 64, 30
L = ctx + 32
g = torch.Generator().manual_seed(0)
kcs = [torch.randn(1, KVH, L, D, generator=g) for _ in range(LAYERS)]
vcs = [torch.randn(1, KVH, L, D, generator=g) for _ in range(LAYERS)]
for n in toks:
    qkv = torch.randn(n, (H + 2 * KVH) * D, generator=g)
    slots = torch.zeros(n, dtype=torch.int64); pos = torch.arange(ctx, ctx + n)
    out = torch.empty(n, H, D)
    res = {k: [] for k in libs}; outs = {}
    for r in range(15):
        for name, lib in libs.items():
            f = lib.dspark_attention_f32
            t = time.perf_counter()
            for rep in range(3):
                for l in range(LAYERS):
                    f(ctypes.c_void_p(qkv.data_ptr()), ctypes.c_int64(qkv.shape[1]), ctypes.c_void_p(kcs[l].data_ptr()), ctypes.c_void_p(vcs[l].data_ptr()),
                      ctypes.c_void_p(slots.data_ptr()), ctypes.c_void_p(pos.data_ptr()), ctypes.c_void_p(out.data_ptr()), ctypes.c_int64(n), ctypes.c_int64(1),
                      ctypes.c_int64(H), ctypes.c_int64(KVH), ctypes.c_int64(D), ctypes.c_int64(L), ctypes.c_float(D ** -0.5), ctypes.c_int(2))
            res[name].append((time.perf_counter() - t) / 3 * 1e3)
            outs[name] = out.clone()
    base = list(libs)[0]
    print(f"ctx {ctx} N {n}: " + "  ".join(f"{k} {statistics.median(v):.2f} ms ({statistics.median([a/b for a,b in zip(v,res[base])]):.2f}x)" for k, v in res.items()),
          " maxdiff", max((outs[k]-outs[base]).abs().max().item() for k in outs))
