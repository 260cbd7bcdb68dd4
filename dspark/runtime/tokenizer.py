"""Tokenizer and chat template of a model directory (local files only, no remote code).

A directory whose tokenizer.json is the whole tokenizer (what transformers itself
writes: the default model, converted GGUF files) is read by the `tokenizers` library
and its chat template rendered with jinja2 the way transformers renders it, which
spares a start-up the import of transformers (over a second). Anything else, and
anything a template needs beyond that (e.g. `{% generation %}` blocks), goes through
transformers' AutoTokenizer, loaded on first use as `tok`.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property
from pathlib import Path

#: tokenizer classes whose tokenizer.json holds all of their behaviour
_PLAIN_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}


class Tokenizer:
    def __init__(self, path: str | Path, extra_eos_ids: list[int] | tuple[int, ...] = ()) -> None:
        self.path = Path(path)
        self._fast = _read_plain(self.path)
        if self._fast is None:
            eos_id = self.tok.eos_token_id
        else:
            eos_id = self._fast.backend.token_to_id(self._fast.special.get("eos_token") or "")
        self.eos_token_ids = sorted(set(extra_eos_ids) | ({eos_id} if eos_id is not None else set()))

    @cached_property
    def tok(self):
        """transformers' tokenizer of the directory (loaded on first use)."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.path), trust_remote_code=False, local_files_only=True)

    @property
    def vocab_size(self) -> int:
        if self._fast is not None:
            return self._fast.backend.get_vocab_size(with_added_tokens=True)
        return len(self.tok)

    def encode(self, text: str) -> list[int]:
        if self._fast is not None:
            return self._fast.backend.encode(text, add_special_tokens=False).ids
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if self._fast is not None:
            return self._fast.backend.decode(ids, skip_special_tokens=skip_special_tokens)
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        if self._fast is not None:
            text = self._fast.render(messages)
            if text is not None:
                return self.encode(text)
        if self.tok.chat_template is None:
            # A base model without a template: plain concatenation of the contents.
            return self.encode("\n".join(m["content"] for m in messages))
        out = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(out, dict) or hasattr(out, "input_ids"):
            out = out["input_ids"]
        return list(out)

    def chat_prompt(self, prompt: str) -> list[int]:
        return self.apply_chat_template([{"role": "user", "content": prompt}])


class _PlainTokenizer:
    """tokenizer.json through `tokenizers`, the chat template through jinja2."""

    def __init__(self, backend, special: dict[str, str], template: str | None) -> None:
        self.backend = backend
        self.special = special
        self.template = template
        self._compiled = None

    def render(self, messages: list[dict]) -> str | None:
        """The template applied to `messages` with the generation prompt; None where
        this renderer cannot (no template, or one that needs transformers' extensions)."""
        if self.template is None:
            return None
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        try:
            if self._compiled is None:
                env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                    extensions=["jinja2.ext.loopcontrols"])
                # As transformers: JSON without HTML escaping, errors a template raises.
                env.filters["tojson"] = _tojson
                env.globals["raise_exception"] = _raise
                env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
                self._compiled = env.from_string(self.template)
            return self._compiled.render(messages=messages, add_generation_prompt=True, tools=None,
                                         documents=None, **self.special)
        except jinja2.TemplateSyntaxError:
            return None


def _tojson(x, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _read_plain(path: Path) -> _PlainTokenizer | None:
    """The directory's tokenizer without transformers, where its tokenizer.json is the
    whole tokenizer; None otherwise."""
    try:
        cfg = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    if (cfg.get("tokenizer_class") not in _PLAIN_CLASSES or cfg.get("clean_up_tokenization_spaces")
            or cfg.get("added_tokens_decoder") or not (path / "tokenizer.json").is_file()):
        return None
    template = cfg.get("chat_template")
    if (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text()
    if not (template is None or isinstance(template, str)):
        return None  # named templates: transformers picks one
    special = {}
    for name in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        value = cfg.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            special[name] = value
    from tokenizers import Tokenizer as Backend

    try:
        backend = Backend.from_file(str(path / "tokenizer.json"))
    except Exception:  # a tokenizer.json this tokenizers version cannot read: transformers decides
        return None
    return _PlainTokenizer(backend, special, template)


class IncrementalDetokenizer:
    """A request's output text, delivered as deltas and cut at the first stop string:
    the one detokenizer of the server and the CLI.

    A request finishes once a stop string appears in its text, with the tokens that
    completed it; the reader must never see the stop string. While it runs, the last
    `len(longest stop) - 1` characters are held back, since they may be the start of
    a stop string that the next tokens complete, and a trailing U+FFFD (half of a
    multi-byte character) waits for the next token. The deltas therefore always
    concatenate to the whole text (`text`)."""

    def __init__(self, tokenizer: Tokenizer, stop: list[str] | tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0  # characters already delivered
        self.text = ""  # the text so far, cut at a stop string
        self.hit_stop = False

    def push(self, token_ids: list[int], finished: bool = False) -> str:
        """Add tokens; returns the text that may be shown now (all of it once `finished`)."""
        self.ids.extend(token_ids)
        text = self.tokenizer.decode(self.ids)
        cuts = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if cuts:
            text = text[: min(cuts)]
            self.hit_stop = True
        self.text = text
        if finished or self.hit_stop:
            ready = len(text)
        elif text.endswith("\ufffd"):
            return ""
        else:
            ready = len(text) - self.holdback
        if ready <= self.sent:
            return ""
        delta = text[self.sent: ready]
        self.sent = ready
        return delta
