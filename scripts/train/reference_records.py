"""Training records from the datasets' own reference answers (no regeneration).

Writes the `dspark data generate` record format, but with the reply taken from the
dataset (ShareGPT's first assistant turn, GSM8K's worked solution) instead of the
target's own answer. The drafter is still trained on the target's distributions
(teacher forcing computes p_k on these tokens), so this trades some acceptance
(human text is not what the target would write) for volume: thousands of sequences
in seconds instead of hours of CPU generation. Train-split prompts only.

    python scripts/train/reference_records.py --out runs/data/reference.jsonl --max-response-tokens 256
"""

from __future__ import annotations

import argparse
import json
import random
import re

from dspark.data import load_prompts
from dspark.data.sources import read_gsm8k, read_sharegpt
from dspark.runtime.target import Target


def sharegpt_replies() -> dict[str, str]:
    return {r.key: r.meta["reply"] for r in read_sharegpt() if r.meta.get("reply")}


def gsm8k_answers() -> dict[str, str]:
    return {r.key: re.sub(r"<<[^>]*>>", "", r.meta["answer"]).replace("\n#### ", "\nThe answer is ")
            for r in read_gsm8k()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-prompt-tokens", type=int, default=512)
    ap.add_argument("--max-response-tokens", type=int, default=256)
    ap.add_argument("--num", type=int, default=4000, help="records to write (balanced math/code/chat)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    tok = Target.load("default").tokenizer
    replies = {("sharegpt", k): v for k, v in sharegpt_replies().items()}
    replies.update({("gsm8k", k): v for k, v in gsm8k_answers().items()})
    by_domain: dict[str, list] = {"math": [], "code": [], "chat": []}
    for p in load_prompts("train"):
        key = (p.source, p.id.split("/", 1)[1])
        if key in replies and replies[key].strip():
            by_domain[p.domain].append((p, replies[key]))
    rng = random.Random(args.seed)
    written = 0
    with open(args.out, "w") as f:
        for domain, items in by_domain.items():
            rng.shuffle(items)
            for p, reply in items[: args.num // 3]:
                prompt_ids = tok.apply_chat_template(p.messages)
                resp = tok.encode(reply)
                if len(prompt_ids) > args.max_prompt_tokens or len(resp) < 8:
                    continue
                finish = "length" if len(resp) > args.max_response_tokens else "stop"
                resp = resp[: args.max_response_tokens]
                rec = {"id": p.id, "domain": p.domain, "source": p.source, "messages": p.messages,
                       "prompt_token_ids": prompt_ids, "response_token_ids": resp,
                       "response_text": tok.decode(resp), "finish_reason": finish, "stop_token_id": None,
                       "seed": 0, "generator": {"model": "dataset-reference", "backend": "reference"},
                       "format": 1}
                f.write(json.dumps(rec) + "\n")
                written += 1
    print(f"wrote {written} records to {args.out}: " + ", ".join(f"{d}={min(len(v), args.num // 3)}" for d, v in by_domain.items()))


if __name__ == "__main__":
    main()
