"""`dspark quantize`: a GGUF file rewritten with Q8_0 / Q4_0 / ... matrices keeps every
metadata field, is served as stored, and computes what transformers computes in fp32
on the new file; bad requests get a message."""

from __future__ import annotations

import pytest
import torch

from conftest import make_tiny_hf_model
from dspark.runtime import cpu_kernels
from test_gguf import IDS, write_tiny_gguf
from test_loading import _logits

gguf = pytest.importorskip("gguf")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path / "cache"))


@pytest.mark.skipif(not cpu_kernels.available(), reason="native kernels unavailable")
@pytest.mark.parametrize("to", ["q8_0", "q4_0", "q5_1"])
def test_quantized_copy_is_served_as_stored(tmp_path, to):
    from transformers import AutoModelForCausalLM

    from dspark.cli.main import main
    from dspark.runtime.target import Target

    hf = make_tiny_hf_model("qwen2", tmp_path / "hf", tie=True)
    src = tmp_path / "tiny-f32.gguf"
    write_tiny_gguf(hf, "qwen2", src)
    out = tmp_path / f"tiny-{to}.gguf"
    assert main(["quantize", "--model", str(src), "--to", to, str(out)]) == 0
    reader = gguf.GGUFReader(str(out))
    kinds = {t.name: t.tensor_type.name for t in reader.tensors}
    assert kinds["blk.0.ffn_down.weight"] == to.upper() and kinds["blk.0.attn_norm.weight"] == "F32"
    before = gguf.GGUFReader(str(src)).fields
    for name in ("tokenizer.ggml.tokens", "tokenizer.chat_template", "qwen2.block_count"):
        assert reader.fields[name].contents() == before[name].contents()
    target = Target.load(str(out), dtype="gguf", device="cpu", max_len=64)
    assert target.precision == "gguf"
    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=out.name, dtype=torch.float32).eval()
    with torch.no_grad():
        want = ref(torch.tensor([IDS])).logits[0]
    torch.testing.assert_close(_logits(target.model, IDS), want, atol=1e-4, rtol=1e-4)


def test_quantize_refuses_what_it_cannot_do(tmp_path, capsys):
    from dspark.cli.main import main

    with pytest.raises(SystemExit):
        main(["quantize", "--to", "q4_k_m", str(tmp_path / "out.gguf")])
    assert "invalid choice" in capsys.readouterr().err
    assert main(["quantize", "--model", str(tmp_path / "missing.gguf"), "--to", "q8_0",
                 str(tmp_path / "out.gguf")]) == 2
    assert "is not a file" in capsys.readouterr().err
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    assert main(["quantize", "--model", str(tmp_path / "junk.gguf"), "--to", "q8_0",
                 str(tmp_path / "out.gguf")]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.skipif(not cpu_kernels.available(), reason="native kernels unavailable")
def test_another_quantization_of_the_default_model_takes_its_shipped_drafters(tmp_path):
    from dspark.cli.main import main
    from dspark.engine.config import resolve_speculative
    from dspark.runtime.target import Target

    out = tmp_path / "smollm2-q8_0.gguf"
    assert main(["quantize", "--to", "q8_0", str(out)]) == 0
    target = Target.load(str(out), max_len=256)
    assert (target.name, target.family) == (out.name, "default") and target.precision in ("gguf", "q8x")
    spec = resolve_speculative("default", target)
    assert spec.method == "dspark" and spec.drafter_path(target.family).name == "dspark"
    tiny = make_tiny_hf_model("qwen2", tmp_path / "hf", tie=True)
    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(tiny, "qwen2", src)
    other = Target.load(str(src), max_len=64)
    assert other.family == other.name == src.name
    assert resolve_speculative("default", other).method == "ngram"  # no drafter shipped for it
