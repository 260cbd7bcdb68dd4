"""Is torch's fp32 `F.linear` batch-invariant on this CPU? For each linear shape of the
default model (SmolLM2-135M) and of the second target (Qwen2.5-Coder-0.5B), random
weights and inputs: whether the first m rows of an 8-row product equal a product of those
m rows alone, bit for bit (m = 1..7), and the largest difference seen.

    python3 benchmarks/avx2-s47/fp32_row_invariance.py
"""
import torch
import torch.nn.functional as F

torch.manual_seed(0)
shapes = {
    "SmolLM2 qkv 576->960": (960, 576), "SmolLM2 o 576->576": (576, 576), "SmolLM2 gate/up 576->1536": (1536, 576),
    "SmolLM2 down 1536->576": (576, 1536), "SmolLM2 head 576->49152": (49152, 576),
    "Qwen q 896->896": (896, 896), "Qwen k/v 896->128": (128, 896), "Qwen gate/up 896->4864": (4864, 896),
    "Qwen down 4864->896": (896, 4864), "Qwen head 896->151936": (151936, 896),
}
print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
for name, (n, k) in shapes.items():
    w, x = torch.randn(n, k), torch.randn(8, k)
    full = F.linear(x, w)
    bad = [m for m in range(1, 8) if not torch.equal(F.linear(x[:m], w), full[:m])]
    worst = max(((F.linear(x[:m], w) - full[:m]).abs().max().item() for m in range(1, 8)), default=0.0)
    print(f"{name:28s} rows differ for m in {bad or 'none'}; largest difference {worst:.2e}")
