# The lookup length chosen per step and what was accepted, fixed 3 against priced lookup (default model, one request).
#   python3 benchmarks/avx2-s49/priced_diag.py
from collections import Counter
from dspark.bench.dataset import heldout_prompts
from dspark.engine.config import SpeculativeConfig
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime.target import Target
from dspark.sampling import SamplingParams
t = Target.load("default", dtype="auto", device="cpu", max_len=2048)
prompts = [t.tokenizer.apply_chat_template(p.chat_messages()) for p in heldout_prompts("mixed", 16)]
for name, spec in [("lookup3", {"method": "ngram", "num_speculative_tokens": 3}),
                   ("priced", {"method": "ngram", "enable_adaptive_verification": True}),
                   ("priced-notrust", {"method": "ngram", "enable_adaptive_verification": True})]:
    e = LLMEngine(t, SpeculativeConfig(**spec), EngineConfig(max_num_seqs=1, max_model_len=2048))
    if name == "priced-notrust": e.runner.drafter.trust.enabled = False
    lens = Counter()
    orig = e.runner._observe
    acc_by_len = Counter()
    def obs(decodes, lengths, accepted, orig=orig):
        for L, a in zip(lengths, accepted): lens[L] += 1; acc_by_len[L] += a
        return orig(decodes, lengths, accepted)
    e.runner._observe = obs
    seqs = e.generate(prompts, SamplingParams(max_tokens=96, ignore_eos=True))
    st = e.total_stats()
    print(name, "rounds", st.rounds, "drafted", st.draft_tokens, "accepted", st.accepted_tokens, "tau %.3f" % st.acceptance_length,
          "lookup gate skipped", e.runner.lookup_gate.skipped, "gate skipped", e.runner.gate.skipped)
    print("   lengths", sorted(lens.items()), "accepted by length", sorted(acc_by_len.items()))
    if hasattr(e.runner.drafter, "trust"): print("   workload trust", e.runner.drafter.trust.workload_factor())
    if e.step_table is not None: print("   table ms 1..8", [round(e.step_table.target_time(k)*1000, 2) for k in range(1, 9)])
