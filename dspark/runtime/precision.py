"""The CPU precisions: what `--dtype` accepts, which of them are batch-invariant, and
how `auto` picks one (a quantized GGUF file: `q8x` or `gguf` by a measurement of the
two, `quantized.choose_activations`; otherwise a short measurement of the candidates,
cached per machine and model shape)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from .config import ModelConfig


#: what `--dtype` accepts besides auto: bf16w = bf16 weights, fp32 compute (native kernel);
#: bf16x = bf16 weights, matmul inputs rounded to bf16 (AMX or avx512_bf16 kernels);
#: gguf = a quantized GGUF file's blocks as stored, fp32 compute (`quantized`);
#: q8x = the same blocks, activations quantized to int8 per 32 (as llama.cpp computes)
PRECISIONS = ("bf16", "fp16", "fp32", "bf16w", "bf16x", "gguf", "q8x")
#: the precisions that read a quantized file's blocks
QUANTIZED_PRECISIONS = ("gguf", "q8x")
_ALIASES = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}
_COMPUTE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "bf16w": torch.float32,
            "bf16x": torch.float32, "gguf": torch.float32, "q8x": torch.float32}


def cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def parse_precision(name: str | None, device: torch.device | str) -> str:
    """A `--dtype` value -> one of PRECISIONS, or "auto" (chosen at load time by
    `choose_precision`, which needs the model's shapes)."""
    if name in (None, "auto"):
        return "bf16" if torch.device(device).type == "cuda" else "auto"
    p = _ALIASES.get(name, name)
    if p not in PRECISIONS:
        raise ValueError(f"unknown dtype {name!r}; choose auto, {', '.join(PRECISIONS)}")
    cpu = torch.device(device).type == "cpu"
    if p in QUANTIZED_PRECISIONS:
        from . import cpu_kernels

        if not cpu:
            raise ValueError(f"--dtype {p} is a CPU precision (a GGUF file's blocks through the native kernel)")
        if not cpu_kernels.available():
            raise ValueError(f"--dtype {p} needs the native CPU kernels: {cpu_kernels.why_unavailable()}")
    if p == "bf16" and cpu:
        # oneDNN's bf16 matmuls choose their blocking by shape: speculative output would
        # differ from plain output (on an avx512_bf16 EPYC, in 8 of 14 served replies).
        # On a CPU bf16 therefore means the batch-invariant bf16 kernels.
        from . import cpu_kernels, cpu_matmul

        if cpu_kernels.available():
            return "bf16x" if cpu_matmul.bf16x_kernel() is not None else "bf16w"
    if p == "bf16w":
        from . import cpu_kernels

        if torch.device(device).type != "cpu":
            raise ValueError("--dtype bf16w is a CPU precision; use bf16 on accelerators")
        if not cpu_kernels.available():
            raise ValueError(f"--dtype bf16w needs the native CPU kernel: {cpu_kernels.why_unavailable()}")
    if p == "bf16x":
        from . import cpu_kernels, cpu_matmul

        if torch.device(device).type != "cpu":
            raise ValueError("--dtype bf16x is a CPU precision; use bf16 on accelerators")
        if cpu_matmul.bf16x_kernel() is None:
            why = cpu_kernels.why_unavailable() or "this CPU has neither AMX nor avx512_bf16"
            raise ValueError(f"--dtype bf16x needs AMX or avx512_bf16 and the native kernels: {why}")
    return p


#: CPU precisions whose kernels compute a token's row the same way whatever else shares
#: the step (one fixed reduction order, no shape-dependent kernel choice), so that a
#: verification step or a chunked prefill gives bit for bit the logits of decoding the
#: tokens one by one. oneDNN's bf16 matmuls pick their blocking by shape, so `bf16` on a
#: CPU is not among them: `auto` never picks it. `fp32` runs its linears through the
#: native fp32-weight kernel (`use_f32_panels`); only where the native kernels cannot
#: run does it fall back to torch's matmuls, which are batch-invariant on some CPUs and
#: not on others (a 2-core AVX2 EPYC: not), and a load then says so
#: (`fp32_rows_invariant`).
BATCH_INVARIANT_CPU = ("bf16w", "bf16x", "fp32", "gguf", "q8x")

#: the precisions `auto` measures against each other (gguf is not measured: a quantized
#: file is served as stored)
MEASURED_CPU = ("bf16w", "bf16x", "fp32")

NOT_INVARIANT_WARNING = (
    "dtype bf16 on a CPU runs oneDNN kernels that choose their blocking by shape: a token's logits can "
    "depend on what else shares its step, so greedy output with speculation, batching or chunked prefill "
    "can differ from plain decoding at near-ties (use --dtype auto, bf16w or fp32 for exact output)")

FP32_NOT_INVARIANT_NOTE = (
    "dtype fp32 without the native kernels: torch's matmuls on this CPU give a row different last bits "
    "depending on how many rows share the product, so greedy output with speculation, batching or chunked "
    "prefill can differ from plain decoding at near-ties")


def fp32_rows_invariant(width: int, rows: int = 8) -> bool:
    """Whether torch's fp32 linear gives every row the same bits whatever the number of
    rows in the product (1..rows), on this CPU and thread count, for a width x width
    weight (a few milliseconds)."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(width, width, generator=gen)
    x = torch.randn(rows, width, generator=gen)
    with torch.inference_mode():
        full = torch.nn.functional.linear(x, w)
        return all(torch.equal(torch.nn.functional.linear(x[:m], w), full[:m]) for m in range(1, rows))


def choose_precision(cfg: ModelConfig, repeats: int = 7) -> tuple[str, str]:
    """The fastest batch-invariant CPU precision for this model on this CPU, by a short
    measurement (1-2 s): products of the model's MLP shape with 1 row (a
    decode step), 8 (a verification) and 32 (a batch or a prompt's chunk), over
    distinct weights of some 128 MB in fp32 so that they stream from memory as a model's
    do (one weight read again and again stays in cache, where fp32 and bf16w run level),
    for bf16w (where the native kernel builds), fp32, and bf16x where the CPU has AMX or
    avx512_bf16. Returns (precision, a line saying what was measured)."""
    best, line, _ = _measure_precisions(cfg, repeats)
    return best, line


#: the precision measurement's weights: distinct ones of the model's MLP shape, this
#: many fp32 bytes in all (beyond a 2-core machine's share of cache), at most this many
MEASURE_BYTES = 128 << 20
MEASURE_WEIGHTS_MAX = 16

#: the rows of the measured products: a decode step, a verification, a batch or chunk
MEASURE_ROWS = (1, 8, 32)

#: the q8x measurement's weights: copies of one of the model's matrices, this many bytes
#: of panels in all (twice a 2-core machine's share of a 32 MiB cache)
MEASURE_Q8X_BYTES = 64 << 20

#: untimed rounds before the timed ones: a freshly packed weight's first products run
#: up to 2.6x slower (page faults, the tiles' first use; an AMX Xeon: 0.28 ms, then
#: 0.17, 0.12, 0.11 for a 1-row product), which made every measurement there look noisy
MEASURE_WARMUP = 4

#: other processes' busy cores (dspark.runtime.machine.busy_cores) above which a
#: precision measurement is not cached
BUSY_CORES_LIMIT = 0.5

#: a measurement whose timed runs vary more than this ((max - min) / median without
#: the extremes, for some precision and rows) ran beside other work: used once, never
#: cached
PRECISION_NOISE = 0.5


def _measure_precisions(cfg: ModelConfig, repeats: int, q8x: list | None = None) -> tuple[str, str, bool]:
    """choose_precision's (precision, line), and whether the runs were steady. The
    rounds alternate the precisions, so that a machine's drift falls on all alike;
    `pick_precision` weighs the times. `q8x`: the segments of one of the model's own
    quantized matrices of the MLP shape (`quantized.QuantMatrix`), to measure the file's
    blocks with int8 activations beside the others (copies of it, MEASURE_Q8X_BYTES in
    all, so that they stream from memory too)."""
    import time

    from . import cpu_kernels, cpu_matmul
    from .weight_formats import _Bf16DotLinearForward, _Bf16WeightLinearForward, _F32PanelLinearForward

    if not cpu_kernels.available():
        why = cpu_kernels.why_unavailable()
        return "fp32", "dtype auto: fp32" + (f" (bf16w unavailable: {why})" if why else ""), True
    gen = torch.Generator().manual_seed(0)
    shape = (2 * cfg.intermediate_size, cfg.hidden_size)
    count = max(1, min(MEASURE_WEIGHTS_MAX, -(-MEASURE_BYTES // (4 * shape[0] * shape[1]))))
    ws = [torch.randn(*shape, generator=gen) * 0.02 for _ in range(count)]
    xs = [torch.randn(m, cfg.hidden_size, generator=gen) for m in MEASURE_ROWS]
    forwards: dict[str, list] = {}
    for name in MEASURED_CPU:
        if name == "bf16x" and (cpu_matmul.bf16x_kernel() is None or cfg.hidden_size % 32):
            continue
        fwds = []
        for w in ws:
            lin = torch.nn.Linear(cfg.hidden_size, shape[0], bias=False)
            lin.weight = torch.nn.Parameter(w.to(torch.float32 if name == "fp32" else torch.bfloat16),
                                            requires_grad=False)
            fwds.append({"bf16w": _Bf16WeightLinearForward, "bf16x": _Bf16DotLinearForward,
                         "fp32": _F32PanelLinearForward}[name](lin))
        forwards[name] = fwds
    if q8x is not None:
        forwards["q8x"] = _q8x_forwards(q8x, cfg.hidden_size)
    times: dict[tuple[str, int], list[float]] = {(n, m): [] for n in forwards for m in MEASURE_ROWS}
    with torch.inference_mode():
        for r in range(MEASURE_WARMUP + repeats):
            for name, fwds in forwards.items() if r % 2 == 0 else reversed(forwards.items()):
                for x in xs:
                    t0 = time.perf_counter()
                    for fwd in fwds:
                        fwd(x)
                    if r >= MEASURE_WARMUP:
                        times[name, len(x)].append((time.perf_counter() - t0) * 1e3 / len(fwds))  # per weight
    runs = {k: sorted(v) for k, v in times.items()}
    point = {k: v[len(v) // 2] for k, v in runs.items()}
    # one run in seven may stray (a sub-millisecond timing on a shared machine): the
    # spread is taken without each point's fastest and slowest run
    steady = all(v[-2] - v[1] <= PRECISION_NOISE * point[k] for k, v in runs.items())
    best = pick_precision(point)
    rows = "/".join(map(str, MEASURE_ROWS))
    report = ", ".join(f"{n} {'/'.join(f'{point[n, m]:.2f}' for m in MEASURE_ROWS)} ms"
                       for n in sorted(forwards, key=lambda n: point[n, 1]))
    return best, f"dtype auto: {best} (matmuls of {rows} rows: {report})", steady


def _q8x_forwards(segments: list, in_features: int) -> list:
    from .quantized import QuantMatrix, gemm_quant

    one = QuantMatrix(segments, in_features, int8_activations=True)
    copies = max(1, -(-MEASURE_Q8X_BYTES // max(1, one.nbytes)))
    mats = [one] + [QuantMatrix([(n, b.clone()) for n, b in segments], in_features, int8_activations=True)
                    for _ in range(copies - 1)]
    return [lambda x, m=m: gemm_quant(x, m) for m in mats]


def pick_precision(point: dict[tuple[str, int], float]) -> str:
    """The precision of the measured products' times (`point[precision, rows]`, ms;
    bf16w and fp32 always, bf16x where it runs): each one's cost is the geometric mean
    over MEASURE_ROWS, so that decode, verification and batched steps weigh alike
    whatever their scale. One row alone misses what AMX tiles do for several: on a
    2-core AMX Xeon bf16x took 1.2-1.4x bf16w's time for 1 row, 0.7-0.8x for 8 and 0.3x
    for 32, and ran the default configuration 1.09x faster at one request and 1.9x at
    32, engine alone (docs/journal.md)."""
    import math

    names = {n for n, _ in point}
    ms = {n: math.exp(sum(math.log(point[n, m]) for m in MEASURE_ROWS) / len(MEASURE_ROWS)) for n in names}
    # bf16w first unless fp32 is clearly faster, so a near-tie does not flip the
    # precision (and the outputs) from one start to the next.
    best = "bf16w" if ms["bf16w"] <= 1.1 * ms["fp32"] else "fp32"
    # bf16x (AMX or avx512_bf16) where it is clearly faster: several times faster for
    # multi-token steps and prefill on AMX (served: docs/journal.md, "bf16x")
    if "bf16x" in ms and ms["bf16x"] <= 0.9 * ms[best]:
        best = "bf16x"
    # q8x (measured for the embedded default model's quantized file) likewise
    if "q8x" in ms and ms["q8x"] <= 0.9 * ms[best]:
        best = "q8x"
    return best


def _precision_cache_file(cfg: ModelConfig, q8x_type: str | None = None) -> Path:
    """Keyed like the step-time tables: the machine (CPU, ISA, threads), torch, the
    kernels' build, the model's MLP shape and the quantized type measured for q8x (all
    the measurement depends on)."""
    import hashlib

    from . import cpu_kernels
    from .cache import cache_root
    from .machine import machine_id

    kernels = cpu_kernels.build_id() if cpu_kernels.available() else "-"
    key = (f"{machine_id()}|{torch.__version__}|{kernels}|{cfg.hidden_size}x{cfg.intermediate_size}"
           f"|rows {MEASURE_ROWS}" + (f"|q8x {q8x_type}" if q8x_type else ""))  # older picks: measured again
    return cache_root() / "precision" / f"{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"


def cached_choose_precision(cfg: ModelConfig, q8x: list | None = None) -> tuple[str, str]:
    """`choose_precision`, measured once per machine and model shape: a steady
    measurement is cached (a noisy one is used for this load only). `q8x`: one of the
    model's quantized matrices (segments), to measure q8x among the candidates."""
    q8x_type = "+".join(sorted({name for name, _ in q8x})) if q8x else None
    f = _precision_cache_file(cfg, q8x_type)
    try:
        saved = json.loads(f.read_text())
        if saved["precision"] in MEASURED_CPU or (q8x and saved["precision"] == "q8x"):
            return saved["precision"], saved["line"] + f"  [measured earlier; delete {f} to measure again]"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    from .machine import busy_cores

    before = busy_cores(0.1)
    best, line, steady = _measure_precisions(cfg, repeats=7, q8x=q8x)
    # Runs that are all slow alike look steady: a measurement beside other work (busy
    # cores before or after it) is used for this load only, never kept for the next.
    busy = max(before or 0.0, busy_cores(0.1) or 0.0)
    if busy >= BUSY_CORES_LIMIT:
        steady = False
        line += f"  [other processes kept {busy:.1f} cores busy: measured again at the next start]"
    if steady:
        try:
            f.parent.mkdir(parents=True, exist_ok=True)
            tmp = f.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({"precision": best, "line": line}))
            os.replace(tmp, f)
        except OSError:
            pass  # an unwritable cache costs only the measurement next time
    return best, line


def device_is_cpu(device: torch.device | str) -> bool:
    return torch.device(device).type == "cpu"


def _gguf_runs() -> bool:
    from . import cpu_kernels

    return cpu_kernels.available()
