"""stack_drafts: proposals from disjoint row sets (drafter rows, lookup rows) as one block."""

import torch

from dspark.drafters.base import DraftOutput, stack_drafts
from dspark.engine.drafts import merge_drafts


def _drafted(rows: int, g: int, vocab: int) -> DraftOutput:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, g, vocab, generator=gen)
    return DraftOutput(logits.argmax(-1), logits, torch.rand(rows, g, generator=gen),
                       num_lookup=torch.tensor([1] * rows))


def _looked(tokens: list[list[int]], valid: list[int]) -> DraftOutput:
    t = torch.tensor(tokens)
    return DraftOutput(t, None, torch.full(t.shape, 0.5), num_valid=torch.tensor(valid),
                       num_lookup=torch.tensor(valid))


def test_point_masses_for_the_rows_without_logits():
    d = _drafted(2, 3, 11)
    lk = _looked([[4, 7, -1], [-1, -1, -1]], [2, 0])
    out = stack_drafts(5, [([3, 0], d), ([1, 4], lk)])
    assert out.num_valid.tolist() == [3, 2, 0, 3, 0]
    assert out.num_lookup.tolist() == [1, 2, 0, 1, 0]
    assert torch.equal(out.tokens[3], d.tokens[0]) and torch.equal(out.tokens[0], d.tokens[1])
    assert torch.equal(out.logits[0], d.logits[1])
    assert out.tokens[1, :2].tolist() == [4, 7] and out.tokens[2].tolist() == [-1, -1, -1]
    row = out.logits[1]
    assert row[0, 4] == 0 and row[1, 7] == 0
    assert torch.isinf(row).sum() == 3 * 11 - 2  # every other entry, and the invalid third slot, is -inf
    assert torch.isinf(out.logits[2]).all() and torch.isinf(out.logits[4]).all()
    assert torch.equal(out.confidence[1], torch.full((3,), 0.5))


def test_confidence_kept_only_when_every_part_has_it():
    d = _drafted(1, 2, 5)
    lk = DraftOutput(torch.tensor([[1, 2]]), None, None)
    out = stack_drafts(2, [([0], d), ([1], lk)])
    assert out.confidence is None and out.num_valid.tolist() == [2, 2]
    out = stack_drafts(2, [([1], lk)])
    assert out.logits is None and out.tokens[0].tolist() == [-1, -1] and out.num_lookup is None


def test_merge_drafts_keeps_one_source_as_is_and_stacks_two():
    d = _drafted(3, 2, 7)
    whole = merge_drafts(3, [0, 1, 2], d, [], None)
    assert whole.tokens is d.tokens and whole.valid == [2, 2, 2]
    lk = _looked([[5, -1]], [1])
    mixed = merge_drafts(3, [0, 2], _drafted(2, 2, 7), [1], lk)
    assert mixed.valid == [2, 1, 2] and mixed.logits[1, 0, 5] == 0 and torch.isinf(mixed.logits[1, 1]).all()
