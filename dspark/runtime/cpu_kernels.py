"""Native CPU kernels, compiled on first use with the system C compiler.

`gemm_bf16w` (kernels/gemm_bf16w.c): fp32 activations times bf16 weights with fp32
accumulation, AVX2 + FMA. It is the `bf16w` precision of the runtime: on CPUs
without avx512_bf16, torch has no fast bf16 matmul (its bf16 kernels are slower than
fp32 there), while decode is bound by reading the weights; this kernel reads half
the bytes of fp32 and computes each output element the same way whatever the batch,
so verification and one-token decoding agree bit for bit.

The shared library is built once per source version into
`$DSPARK_CACHE_DIR/kernels` (default `~/.cache/dspark/kernels`) with
`cc -O3 -mavx2 -mfma -fopenmp`, written aside and renamed so concurrent first uses
cannot see a half-written file. Where there is no compiler, no AVX2/FMA or the build
fails, `load()` returns None and callers keep the torch paths (`why_unavailable()`
says why). Set `DSPARK_NO_NATIVE=1` to turn the kernels off.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

_SOURCE = Path(__file__).with_name("kernels") / "gemm_bf16w.c"
_FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC"]
_lib: ctypes.CDLL | None = None
_why: str | None = None
_loaded = False


def cache_dir() -> Path:
    root = os.environ.get("DSPARK_CACHE_DIR") or Path.home() / ".cache" / "dspark"
    return Path(root) / "kernels"


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _build(target: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc/gcc) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run([cc, *_FLAGS, "-o", tmp, str(_SOURCE)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[-500:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load() -> ctypes.CDLL | None:
    """The compiled kernel library, building it on first use; None where it cannot run."""
    global _lib, _why, _loaded
    if _loaded:
        return _lib
    _loaded = True
    if os.environ.get("DSPARK_NO_NATIVE"):
        _why = "DSPARK_NO_NATIVE is set"
        return None
    missing = {"avx2", "fma"} - cpu_flags()
    if missing:
        _why = f"this CPU lacks {', '.join(sorted(missing))}"
        return None
    digest = hashlib.sha256(_SOURCE.read_bytes() + " ".join(_FLAGS).encode()).hexdigest()[:16]
    path = cache_dir() / f"gemm_bf16w-{digest}.so"
    try:
        if not path.is_file():
            _build(path)
        lib = ctypes.CDLL(str(path))
    except (OSError, RuntimeError) as e:
        _why = f"could not build the native kernel: {e}"
        return None
    fn = lib.dspark_gemm_bf16w
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    fn.restype = None
    _lib = lib
    return lib


def why_unavailable() -> str | None:
    load()
    return _why


def available() -> bool:
    return load() is not None


def gemm_bf16w(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] fp32 @ weight[N, K].T (bf16) (+ bias [N] fp32) -> [..., N] fp32."""
    lib = load()
    if lib is None:
        raise RuntimeError(f"native bf16w kernel unavailable: {_why}")
    k = weight.shape[1]
    if x.shape[-1] != k:
        raise ValueError(f"input has {x.shape[-1]} features, the weight expects {k}")
    x2 = x.reshape(-1, k).to(torch.float32).contiguous()
    w = weight.contiguous()
    if w.dtype != torch.bfloat16 or w.device.type != "cpu" or x2.device.type != "cpu":
        raise TypeError("gemm_bf16w takes a CPU bf16 weight and CPU activations")
    b = None if bias is None else bias.to(torch.float32).contiguous()
    out = torch.empty(x2.shape[0], w.shape[0], dtype=torch.float32)
    if x2.shape[0]:
        lib.dspark_gemm_bf16w(x2.data_ptr(), w.data_ptr(), None if b is None else b.data_ptr(),
                              out.data_ptr(), x2.shape[0], w.shape[0], k, torch.get_num_threads())
    return out.view(*x.shape[:-1], w.shape[0])
