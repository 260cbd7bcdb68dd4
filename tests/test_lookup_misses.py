"""Training weighted where prompt lookup misses: the one-pass lookup agrees with the
engine's `lookup` at every position, and the weights follow the anchors."""

from __future__ import annotations

import random

import torch

from dspark.drafters.lookup import lookup
from dspark.train.lookup_misses import lookup_first_tokens, lookup_miss_weights, lookup_misses
from dspark.train.objectives import AnchorBatch


def test_one_pass_lookup_proposes_what_the_engines_lookup_proposes():
    rng = random.Random(3)
    for alphabet, length in ((3, 60), (6, 120), (40, 200)):  # many, some and few matches, ties included
        toks = [rng.randrange(alphabet) for _ in range(length)]
        first = lookup_first_tokens(toks)
        for i in range(len(toks)):
            m = lookup(toks[: i + 1], 1)
            assert first[i] == (m.tokens[0] if m.ngram else None), (alphabet, i)
    assert lookup_first_tokens([5, 1, 2, 5, 1]) == [None, None, None, 1, 2]


def test_misses_and_their_weights_follow_the_anchors():
    toks = [1, 2, 3, 1, 2, 3, 1, 2, 4]
    miss = lookup_misses(toks)
    # after [..., 1, 2] lookup proposes 3: right at 4, wrong at 7 (4 follows); nothing before a repeat
    assert miss.tolist() == [True, True, True, False, False, False, False, True, False]
    batch = AnchorBatch.build([toks], [[1, 4, 7]], 2, "cpu")
    w = lookup_miss_weights(batch, [miss], 3.0)
    expected = torch.tensor([4.0, 4.0, 1.0, 1.0, 4.0])  # anchor 7 has one label (position 8) only
    assert torch.equal(w, expected)
