"""Where a drafter's teacher-forced τ and the engine's τ part ways.

Generates the target's greedy replies to the prompts `dspark eval acceptance` uses
(held-out, first N per domain), then measures the drafter on them teacher-forced two
ways (dspark/train/heldout.py): the per-anchor mean that training logs, and the
renewal τ, the rounds greedy decoding with a fixed block would take over the same
text. Beside them, the engine's own τ at that block on the same prompts. If the
renewal τ matches the engine's, the gap to the per-anchor τ is the weighting of
positions, not a fault of the engine.

    python scripts/dev/renewal_tau.py --drafter dspark/drafters/shipped/dspark --num-prompts 10 \
        --max-tokens 128 --out runs/renewal
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", required=True, help="a dspark/dflash/eagle3/mtp drafter directory")
    ap.add_argument("--domains", default="math,code,chat")
    ap.add_argument("--num-prompts", type=int, default=10, help="per domain")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--block", type=int, default=7, help="drafted tokens per round in the engine")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--out", required=True, help="directory for the greedy records and the result")
    args = ap.parse_args()

    from dspark.drafters.checkpoint import read_config
    from dspark.engine.config import EngineConfig
    from dspark.engine.engine import LLMEngine
    from dspark.eval.acceptance import heldout_prompt_ids, measure_acceptance
    from dspark.runtime.target import Target
    from dspark.sampling import SamplingParams
    from dspark.train.config import TrainConfig
    from dspark.train.heldout import renewal_tau
    from dspark.train.trainer import Trainer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = Target.load("default", dtype=args.dtype)
    domains = args.domains.split(",")
    prompts = heldout_prompt_ids(target.tokenizer, domains, args.num_prompts, 1024)
    records = out / "greedy.jsonl"
    engine = LLMEngine(target, None, EngineConfig(max_num_seqs=args.num_prompts, max_model_len=2048))
    result = {"engine": {}}
    with records.open("w") as f:
        for d in domains:
            params = [SamplingParams(temperature=0.0, max_tokens=args.max_tokens) for _ in prompts[d]]
            for i, (p, s) in enumerate(zip(prompts[d], engine.generate(prompts[d], params))):
                f.write(json.dumps({"id": f"{d}/{i}", "domain": d, "prompt_token_ids": p,
                                    "response_token_ids": list(s.output_ids), "finish_reason": "length"}) + "\n")
            r = measure_acceptance(target, args.drafter, args.block, prompts[d], max_tokens=args.max_tokens,
                                   max_num_seqs=args.num_prompts, domain=d)
            result["engine"][d] = round(r.acceptance_length, 4)
            print(f"[renewal] {d}: engine tau {r.acceptance_length:.3f}", flush=True)
    cfg = TrainConfig(method=read_config(args.drafter).method, data=[str(records)], out=str(out / "unused"), init=args.drafter,
                      batch_size=4, blocks_per_seq=256, progress=False)
    trainer = Trainer(cfg, target)
    if trainer.gamma != args.block:
        print(f"[renewal] note: the drafter's block is {trainer.gamma}, the engine drafted {args.block}")
    result["teacher_forced"] = renewal_tau(trainer, trainer.teacher, trainer.seqs)
    (out / "renewal.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
