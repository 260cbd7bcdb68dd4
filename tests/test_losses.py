"""The drafter training loss on hand-made tensors: its terms by hand, the bound the
top-k targets put on the exact distance, what gets gradients, and the expected
acceptance length."""

from __future__ import annotations

import math

import pytest
import torch

from dspark.train.losses import (
    expected_acceptance_length,
    position_terms,
    position_weights,
    weighted_sums,
)


# --- the loss on hand-made tensors ---------------------------------------------------------


def _full_terms(q, p, labels, conf=None):
    """position_terms with p given whole (top-k = the full vocabulary)."""
    probs = p.softmax(-1)
    top = probs.topk(p.shape[-1], dim=-1)
    return position_terms(q, top.indices, top.values, labels, conf)


def test_loss_terms_by_hand():
    q = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    p = torch.tensor([[0.0, 0.0, 0.0], [0.0, 5.0, 0.0], [1.0, 1.0, -1.0]])
    labels = torch.tensor([0, 1, 2])
    conf = torch.tensor([0.5, -1.0, 2.0])
    k = torch.tensor([0, 1, 2])
    terms = _full_terms(q, p, labels, conf)
    sq, sp = q.softmax(-1), p.softmax(-1)
    torch.testing.assert_close(terms.ce, -sq[torch.arange(3), labels].log())
    l1 = (sq - sp).abs().sum(-1)
    torch.testing.assert_close(terms.l1, l1)
    torch.testing.assert_close(terms.accept, 1 - 0.5 * l1)
    target = 1 - 0.5 * l1
    s = torch.sigmoid(conf)
    torch.testing.assert_close(terms.bce, -(target * s.log() + (1 - target) * (1 - s).log()))
    w = position_weights(k, "dspark")
    torch.testing.assert_close(w, torch.tensor([1.0, math.exp(-0.25), math.exp(-0.5)]))
    torch.testing.assert_close(position_weights(k, "dspark", decay=2.0), torch.tensor([1.0, math.exp(-0.5), math.exp(-1.0)]))
    sums = weighted_sums(terms, w)
    want = (w * (0.1 * terms.ce + 0.9 * l1 + 1.0 * terms.bce)).sum()
    torch.testing.assert_close(sums["loss"], want)
    torch.testing.assert_close(position_weights(k, "eagle3"), torch.tensor([1.0, 0.8, 0.64]))
    no_conf = _full_terms(q, p, labels)
    assert no_conf.bce is None and "bce" not in weighted_sums(no_conf, w)
    torch.testing.assert_close(weighted_sums(no_conf, w)["loss"], (w * (0.1 * no_conf.ce + 0.9 * l1)).sum())


def test_topk_targets_bound_the_exact_distance():
    """With p truncated to its top k, the computed L1 lies within [exact - 2 tail, exact]
    and equals it when the tail is empty; tokens outside a reduced draft vocabulary
    count with q = 0, and labels outside it give no CE."""
    from dspark.train.teacher import TopKTargets

    g = torch.Generator().manual_seed(1)
    q = torch.randn(40, 50, generator=g) * 3
    p = torch.randn(40, 50, generator=g) * 3
    exact = (q.softmax(-1) - p.softmax(-1)).abs().sum(-1)
    for k in (1, 4, 16, 50):
        top = TopKTargets.of_logits(p, k)
        terms = position_terms(q, top.ids, top.probs, torch.zeros(40, dtype=torch.long))
        assert torch.all(terms.l1 <= exact + 1e-5)
        assert torch.all(terms.l1 >= exact - 2 * top.tail - 1e-5)
        if k == 50:
            torch.testing.assert_close(terms.l1, exact, atol=1e-5, rtol=0)
    # a draft vocabulary of the first 30 target ids: q lives on those, p anywhere
    draft = q[:, :30]
    full_q = torch.cat([draft, torch.full((40, 20), float("-inf"))], dim=-1)
    exact = (full_q.softmax(-1) - p.softmax(-1)).abs().sum(-1)
    top = TopKTargets.of_logits(p, 50)
    ids = torch.where(top.ids < 30, top.ids, torch.full_like(top.ids, -1))
    labels = torch.tensor([3, 35] * 20)
    labels_d = torch.where(labels < 30, labels, torch.full_like(labels, -1))
    terms = position_terms(draft, ids, top.probs, labels_d)
    torch.testing.assert_close(terms.l1, exact, atol=1e-5, rtol=0)
    assert torch.all(terms.ce[1::2] == 0) and torch.all(terms.ce[::2] > 0)


def test_bce_target_is_detached_and_p_gets_no_gradient():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(5, 7, generator=g, requires_grad=True)
    p = torch.randn(5, 7, generator=g).softmax(-1).requires_grad_(True)
    ids = torch.arange(7).expand(5, 7)
    conf = torch.randn(5, generator=g, requires_grad=True)
    terms = position_terms(q, ids, p, torch.arange(5), conf)
    terms.bce.sum().backward()
    assert q.grad is None or torch.count_nonzero(q.grad) == 0  # BCE moves only the confidence head
    torch.testing.assert_close(conf.grad, torch.sigmoid(conf.detach()) - terms.accept)
    q.grad = None
    terms = position_terms(q, ids, p, torch.arange(5), conf)
    weighted_sums(terms, torch.ones(5))["loss"].backward()
    assert p.grad is None  # the target is a constant
    assert q.grad is not None and torch.count_nonzero(q.grad) > 0


def test_expected_acceptance_length():
    assert expected_acceptance_length([]) == 1.0
    assert expected_acceptance_length([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_acceptance_length([1.0] * 7) == pytest.approx(8.0)


# --- data and teacher forcing ---------------------------------------------------------------
