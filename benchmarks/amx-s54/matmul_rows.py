import time, torch
from pathlib import Path
from dspark.runtime.config import ModelConfig
from dspark.runtime.default_model import default_model_dir
from dspark.runtime.weight_formats import _Bf16DotLinearForward, _Bf16WeightLinearForward
cfg = ModelConfig.from_dir(Path(default_model_dir()))
gen = torch.Generator().manual_seed(0)
shape = (2 * cfg.intermediate_size, cfg.hidden_size)
count = max(1, min(16, -(-(128<<20) // (4 * shape[0] * shape[1]))))
print("count", count, shape)
ws = [torch.randn(*shape, generator=gen) * 0.02 for _ in range(count)]
fw = {}
for name, cls in (("bf16w", _Bf16WeightLinearForward), ("bf16x", _Bf16DotLinearForward)):
    fw[name] = []
    for w in ws:
        lin = torch.nn.Linear(cfg.hidden_size, shape[0], bias=False)
        lin.weight = torch.nn.Parameter(w.to(torch.bfloat16), requires_grad=False)
        fw[name].append(cls(lin))
with torch.inference_mode():
  for m in (1, 8, 32):
    x = torch.randn(m, cfg.hidden_size, generator=gen)
    for name, fwds in fw.items():
        times = []
        for r in range(12):
            t0 = time.perf_counter()
            for f in fwds: f(x)
            times.append((time.perf_counter() - t0) * 1e3 / len(fwds))
        print(m, name, " ".join(f"{t:.3f}" for t in times))
