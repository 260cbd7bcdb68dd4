"""Greedy exactness against an independent reference: transformers' own greedy
`generate` in fp32 on the same weights, compared token for token with our runtime's
plain decoding and with every speculative configuration asked for.

Used by `scripts/dev/check_second_target.py` (a real GGUF target, by hand) and the tests
(the same check in CI)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ExactnessRow:
    prompt: str
    config: str
    ours: list[int]
    reference: list[int]

    @property
    def equal(self) -> bool:
        return self.ours == self.reference


def _without_eos(ids: list[int], eos_ids: list[int]) -> list[int]:
    return ids[:-1] if ids and ids[-1] in eos_ids else ids


def transformers_greedy(model_dir: str, prompts_ids: list[list[int]], max_tokens: int,
                        eos_ids: list[int]) -> list[list[int]]:
    """Each prompt's greedy continuation by transformers fp32, without the EOS that
    ends it (our runtime does not return it either)."""
    from transformers import AutoModelForCausalLM

    from dspark.runtime.gguf_convert import ensure_dense

    ensure_dense(model_dir)  # a converted GGUF's linears may be held as blocks only
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outs = []
    with torch.no_grad():
        for ids in prompts_ids:
            out = ref.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False,
                               eos_token_id=eos_ids, pad_token_id=eos_ids[0], attention_mask=torch.ones(1, len(ids),
                                                                                                       dtype=torch.long))
            outs.append(_without_eos(out[0, len(ids):].tolist(), eos_ids))
    del ref
    return outs


def check_greedy(target, prompts: list[str], configs: dict, max_tokens: int, max_len: int = 1024,
                 on_row=None) -> list[ExactnessRow]:
    """Our greedy output for every prompt (chat template applied) under every config
    (name -> SpeculativeConfig, or None for plain decoding), each against transformers
    fp32 on `target.path`. `on_row` sees each row as it is done."""
    from dspark.generate import generate_plain, generate_speculative
    from dspark.sampling import SamplingParams

    prompts_ids = [target.tokenizer.chat_prompt(p) for p in prompts]
    references = transformers_greedy(str(target.path), prompts_ids, max_tokens, target.tokenizer.eos_token_ids)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    rows = []
    for name, spec in configs.items():
        for prompt, ids, ref in zip(prompts, prompts_ids, references):
            if spec is None:
                ours = generate_plain(target, ids, params, max_len=max_len).token_ids
            else:
                ours = generate_speculative(target, ids, params, spec, max_len=max_len).token_ids
            row = ExactnessRow(prompt, name, _without_eos(list(ours), target.tokenizer.eos_token_ids), ref)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows
