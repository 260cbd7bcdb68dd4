"""The default at one request under cProfile (functions by cumulative time), beside the
same steps' target forward: where the time outside the forward goes.

    python3 benchmarks/avx2-s46/cprofile_c1.py [plain]
"""
import sys, cProfile, pstats
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import SpeculativeConfig, DEFAULT_SPECULATIVE
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams

target = Target.load("default", dtype="auto", device="cpu", max_len=2048)
prompts = [target.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", 8)]
spec = None if "plain" in sys.argv else SpeculativeConfig(**DEFAULT_SPECULATIVE)
e = LLMEngine(target, spec, EngineConfig(max_num_seqs=1, max_model_len=2048))
e.generate(prompts[:1], SamplingParams(max_tokens=16, ignore_eos=True))
params = SamplingParams(max_tokens=96, ignore_eos=True)
def run():
    for p in prompts[1:]:
        e.add_request(p, params)
        while e.has_unfinished():
            e.step()
pr = cProfile.Profile()
pr.enable(); run(); pr.disable()
pstats.Stats(pr).sort_stats("tottime" if "tottime" in sys.argv else "cumulative").print_stats(45)
