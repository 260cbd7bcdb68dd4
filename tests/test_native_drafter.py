"""A bf16w (or fp32: f32w, or its linears quantized to Q8_0: q8x) DSpark drafter's block and context through the native decoder kernel
(runtime/native_stack.py, `for_drafter_layers`) against its torch path: the same
drafted tokens, logits and confidences to fp32 rounding, the same context keys and
values in the pool, and (through an engine) the same greedy output and rounds."""

import pytest
import torch

from dspark.drafters.base import DraftRequest
from dspark.engine.config import SpeculativeConfig
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.runtime import cpu_kernels
from dspark.sampling import SamplingParams

PROMPTS = ["Write a Python function that reverses a string.", "How many legs do three spiders have?"]


def _engine(target, native: bool, monkeypatch, weights: str = "bf16"):
    engine = LLMEngine(target, SpeculativeConfig(method="dspark", num_speculative_tokens=3, drafter_weights=weights),
                       EngineConfig(max_num_seqs=2, max_model_len=512))
    drafter = engine.runner.drafter
    if not native:
        monkeypatch.setattr(drafter, "_stack", lambda: None)
    return engine, drafter


@pytest.mark.parametrize("precision, weights", [("bf16w", "bf16"), ("fp32", "bf16"), ("bf16w", "q8_0")])
def test_native_drafter_block_and_context_equal_the_torch_path(precision, weights, request, monkeypatch):
    target = request.getfixturevalue(f"default_target_{precision}")
    if not cpu_kernels.available():
        pytest.skip(f"native kernels unavailable: {cpu_kernels.why_unavailable()}")
    runs = {}
    for native in (True, False):
        engine, drafter = _engine(target, native, monkeypatch, weights)
        seqs = [engine.add_request(target.tokenizer.chat_prompt(p), SamplingParams(max_tokens=40, ignore_eos=True))
                for p in PROMPTS]
        steps = 0
        while not all(s.is_finished for s in seqs):
            if steps == 6:  # mid-stream: both requests live, contexts of different lengths
                ids = [s.request_id for s in seqs]
                slots = [drafter.slot(i) for i in ids]
                lens = [drafter.context_length(i) for i in ids]
                kv = [t[s, :, :n].clone() for t in (*drafter.pool.k, *drafter.pool.v) for s, n in zip(slots, lens)]
                reqs = [DraftRequest(i, 16 + j, n, SamplingParams(), None) for j, (i, n) in enumerate(zip(ids, lens))]
                drafter.greedy_logits = True  # (the engine's drafter leaves a greedy draft's q out)
                block = drafter.draft(reqs, 7)
                drafter.greedy_logits = False
            engine.step()
            steps += 1
        runs[native] = ([s.output_ids for s in seqs], steps, kv, block, drafter.__dict__.get("_native_stack"))
    (out_n, steps_n, kv_n, block_n, stack), (out_t, steps_t, kv_t, block_t, _) = runs[True], runs[False]
    assert stack is not None and stack._context is not None  # the native path did run
    # fp32's drafter takes the target's f32w kernel; a quantized drafter the q8x one (3: blocks)
    assert stack.kind == (3 if weights != "bf16" else {"bf16w": 0, "fp32": 2}[precision])
    assert out_n == out_t  # exact either way: verification decides
    assert steps_n == steps_t
    for a, b in zip(kv_n, kv_t):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert torch.equal(block_n.tokens, block_t.tokens)
    finite = torch.isfinite(block_t.logits)
    assert torch.equal(finite, torch.isfinite(block_n.logits))
    torch.testing.assert_close(block_n.logits[finite], block_t.logits[finite], atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(block_n.confidence, block_t.confidence, atol=1e-5, rtol=1e-4)


def test_native_drafter_leaves_a_block_without_room_to_torch(default_target_bf16w, monkeypatch):
    """A context too close to the pool's end for the block falls back to the torch
    path (the kernel writes the block's keys past the context)."""
    engine, drafter = _engine(default_target_bf16w, True, monkeypatch)
    calls = []
    real = drafter.run_backbone
    monkeypatch.setattr(drafter, "run_backbone", lambda *a, **k: calls.append(1) or real(*a, **k))
    seq = engine.add_request([1, 2, 3, 4], SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()
    assert not calls
    rid = seq.request_id
    n = drafter.context_length(rid)
    max_len = drafter.pool.max_len
    drafter.pool.lengths[drafter.slot(rid)] = drafter._context_len[drafter.slot(rid)] = max_len - 3
    drafter.draft([DraftRequest(rid, 5, max_len - 3, SamplingParams(), None)], 3)
    assert calls == [1]
    assert n < max_len - 3
