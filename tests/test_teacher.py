"""What the frozen target teaches, from its feature cache: the cached hidden states and
top-k targets equal running the target, and an interrupted cache build resumes."""

from __future__ import annotations

import torch
import pytest

from test_train import tiny_data, tiny_dir, tiny_target  # noqa: F401  (shared fixtures)


def test_cached_teacher_equals_running_the_target(tiny_target, tiny_data, tmp_path):
    from dspark.train.data import load_sequences
    from dspark.train.teacher import CachedTeacher, OnTheFlyTeacher

    seqs = load_sequences([tiny_data], 1, 512)[:5]
    layers = [0, 2]
    rows = [[s.prompt_len, len(s.tokens) - 2] for s in seqs]
    live_h, live_p = OnTheFlyTeacher(tiny_target.model, layers, seqs, topk=8).teach([0, 3, 4], [rows[0], rows[3], rows[4]])
    cached = CachedTeacher(tiny_target.model, layers, seqs, tmp_path, "tiny", progress=False, topk=8)
    h, p = cached.teach([0, 3, 4], [rows[0], rows[3], rows[4]])
    torch.testing.assert_close(h, live_h, atol=1e-5, rtol=0)
    assert p.ids.shape == (6, 8)
    torch.testing.assert_close(p.probs, live_p.probs, atol=1e-3, rtol=0)  # stored in fp16
    assert torch.equal(p.ids[:, 0], live_p.ids[:, 0])
    # a second drafter with other taps reuses the same file; another k builds another
    again = CachedTeacher(tiny_target.model, [1, 3], seqs, tmp_path, "tiny", build=False, topk=8)
    assert again.path == cached.path
    with pytest.raises(FileNotFoundError):
        CachedTeacher(tiny_target.model, [1, 3], seqs, tmp_path, "tiny", build=False, topk=4)


def test_feature_cache_build_resumes_from_its_last_shard(tiny_target, tiny_data, tmp_path, monkeypatch):
    """An interrupted cache build (shards written, no manifest) resumes: only the
    sequences of the lost shard run the target again, and the finished cache reads the
    same as one built in a single pass."""
    from dspark.train import feature_store
    from dspark.train.data import load_sequences
    from dspark.train.teacher import CachedTeacher, OnTheFlyTeacher

    seqs = load_sequences([tiny_data], 1, 512)[:6]
    rows = [[s.prompt_len, len(s.tokens) - 2] for s in seqs]
    monkeypatch.setattr(feature_store, "SHARD_BYTES", 1)  # a shard per batch group
    first = CachedTeacher(tiny_target.model, [0, 2], seqs, tmp_path, "tiny", progress=False, topk=8,
                          build_batch_tokens=1)  # one sequence per group
    parts = sorted(tmp_path.glob("*.part*.safetensors"))
    assert len(parts) == len(seqs) and first.path.suffix == ".json"
    # interrupt: the manifest and the last shard are lost
    first.path.unlink()
    parts[-1].unlink()
    ran = []
    real_run = OnTheFlyTeacher.run

    def counting_run(self, tokens, layers, rows_):
        ran.append(len(tokens))
        return real_run(self, tokens, layers, rows_)

    monkeypatch.setattr(OnTheFlyTeacher, "run", counting_run)
    again = CachedTeacher(tiny_target.model, [0, 2], seqs, tmp_path, "tiny", progress=False, topk=8,
                          build_batch_tokens=1)
    assert ran == [1]
    monkeypatch.setattr(OnTheFlyTeacher, "run", real_run)
    live_h, live_p = OnTheFlyTeacher(tiny_target.model, [0, 2], seqs, topk=8).teach(list(range(6)), rows)
    h, p = again.teach(list(range(6)), rows)
    torch.testing.assert_close(h, live_h, atol=1e-5, rtol=0)
    assert torch.equal(p.ids[:, 0], live_p.ids[:, 0])
