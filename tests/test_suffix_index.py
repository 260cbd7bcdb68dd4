"""The incremental n-gram index answers exactly what the full scans it replaces answer."""

import random

import torch

from dspark.drafters.lookup import lookup
from dspark.drafters.ngram import propose_continuation
from dspark.drafters.suffix_index import SuffixIndex


def test_every_prefix_matches_the_scans():
    rng = random.Random(0)
    for max_ngram, min_ngram, vocab in [(3, 1, 4), (4, 2, 3), (2, 1, 9), (1, 1, 5)]:
        seq = [rng.randrange(vocab) for _ in range(160)]
        index = SuffixIndex(max_ngram, min_ngram)
        matched = 0
        for length in range(1, len(seq) + 1):
            index.sync(seq[:length])
            t = torch.tensor(seq[:length])
            for k in (1, 4, 7):
                ref = lookup(t, k, max_ngram, min_ngram)
                assert index.most_frequent(k) == (ref.tokens, ref.ngram, ref.agreed), (length, k)
                assert index.latest(k) == propose_continuation(t, k, max_ngram, min_ngram), (length, k)
                matched += bool(ref.tokens)
        assert matched > 300  # the comparison saw real matches, contested and agreed


def test_sync_takes_parts_and_rebuilds_when_the_sequence_changes():
    a, b = [5, 6, 7, 5, 6], [7, 5]
    index = SuffixIndex()
    index.sync(a, b)
    assert index.tokens == a + b and index.latest(3) == [6, 7, 5]
    index.sync(a, b + [9])  # grows: only the new token is added
    assert index.tokens == a + b + [9]
    index.sync([1, 2, 1])  # shorter and different: rebuilt
    assert index.tokens == [1, 2, 1] and index.most_frequent(2) == ([2, 1], 1, True)
    index.sync([1, 2, 3, 4])  # same length class but a different last token: rebuilt
    assert index.tokens == [1, 2, 3, 4] and index.latest(2) == []
