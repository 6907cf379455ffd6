"""Token counts with the serving model's own tokenizer and chat template.

A pool names where its tokenizer comes from (`Pool.tokenizer`):
- `gguf:PATH` (or `gguf:` for the bundled SmolLM2 file): the vocabulary, merges, special tokens and chat
  template stored in the GGUF file llama.cpp serves. They are read with `gguf` (llama.cpp's own reader) and
  rebuilt as a Hugging Face `tokenizers` byte-level BPE; the result is cached as tokenizer.json beside the
  state folder (reading 49k tokens out of the GGUF takes seconds, loading the cache milliseconds).
- `hf:DIR`: a Hugging Face model folder (tokenizer.json, tokenizer_config.json with its chat_template), what
  SGLang serves on GPUs.

The count of a chat prompt is the count of the chat template's rendering (Jinja, as transformers and
llama.cpp render it), special tokens included, so it equals the engine's `prompt_tokens`
(tests/stack/test_memory.py checks this on every turn). Only the byte-level BPE family (GPT-2, SmolLM,
Llama 3, Qwen) is rebuilt from GGUF; other models use `hf:`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from runtime.settings import state_dir

# llama.cpp's pre-tokenizer names for the GPT-2 regex, with digits split one by one or not (llama-vocab.cpp).
_DIGITS_SPLIT = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
_GPT2 = {"gpt2", "default", "mpt", "olmo", "jais"} | _DIGITS_SPLIT
_CONTROL = 3  # llama.cpp token type of special (control) tokens


class ChatTokenizer:
    """Counts the tokens of texts and of whole chat prompts for one model."""

    def __init__(self, tokenizer: Tokenizer, template: str, bos: str = "", eos: str = "") -> None:
        self.tokenizer = tokenizer
        self.template_source = template
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self.template = env.from_string(template)
        self.bos, self.eos = bos, eos

    def count(self, text: str) -> int:
        """Tokens of a plain text (no template, special tokens in it are not special)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def render(self, messages: Sequence[Mapping[str, Any]]) -> str:
        return self.template.render(
            messages=messages, add_generation_prompt=True, bos_token=self.bos, eos_token=self.eos
        )

    def count_chat(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Tokens of the prompt the engine builds from these messages (template and generation prompt)."""
        return len(self.tokenizer.encode(self.render(messages), add_special_tokens=False).ids)

    def count_continued(self, messages: Sequence[Mapping[str, Any]], continuation: str) -> int:
        """Tokens of the prompt that continues an answer after `continuation` (a taken-over run): the
        engine renders the chat up to the assistant's turn and appends the partial answer as text."""
        return len(
            self.tokenizer.encode(
                self.render(messages) + continuation, add_special_tokens=False
            ).ids
        )

    def truncate(self, text: str, tokens: int) -> str:
        """The longest opening of `text` that is at most `tokens` tokens."""
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        if len(encoding.ids) <= tokens:
            return text
        return text[: encoding.offsets[tokens - 1][1]] if tokens > 0 else ""


def _from_gguf(path: Path) -> tuple[Tokenizer, dict[str, Any]]:
    from gguf import GGUFReader  # imported here: only the first start after an install needs it

    fields = GGUFReader(str(path)).fields

    def get(key: str, default: Any = None) -> Any:
        return fields[key].contents() if key in fields else default

    kind, pre = get("tokenizer.ggml.model"), get("tokenizer.ggml.pre", "default")
    if kind != "gpt2" or pre not in _GPT2:
        raise ValueError(
            f"{path}: tokenizer {kind}/{pre} is not a byte-level BPE this module rebuilds; use hf:"
        )
    tokens: list[str] = get("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in get("tokenizer.ggml.merges")]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if pre in _DIGITS_SPLIT
        else byte_level
    )
    tokenizer.decoder = decoders.ByteLevel()
    types = get("tokenizer.ggml.token_type")
    tokenizer.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, kind in zip(tokens, types, strict=True)
            if kind == _CONTROL
        ]
    )
    bos, eos = get("tokenizer.ggml.bos_token_id"), get("tokenizer.ggml.eos_token_id")
    config = {
        "chat_template": get("tokenizer.chat_template"),
        "bos_token": tokens[bos] if bos is not None else "",
        "eos_token": tokens[eos] if eos is not None else "",
    }
    return tokenizer, config


def _gguf_cached(path: Path) -> tuple[Tokenizer, dict[str, Any]]:
    stat = path.stat()
    key = hashlib.sha256(
        f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()
    ).hexdigest()[:16]
    folder = state_dir() / "tokenizers" / key
    if (folder / "tokenizer.json").exists():
        return Tokenizer.from_file(str(folder / "tokenizer.json")), json.loads(
            (folder / "config.json").read_text()
        )
    tokenizer, config = _from_gguf(path)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    partial = (
        folder / f"tokenizer.json.{os.getpid()}"
    )  # processes starting together each write their own
    tokenizer.save(str(partial))
    partial.replace(folder / "tokenizer.json")
    return tokenizer, config


def _text(value: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    return value.get("content", "") if isinstance(value, dict) else (value or "")


@functools.cache
def load(spec: str) -> ChatTokenizer:
    """The tokenizer a pool names (see the module docstring); loaded once per process."""
    kind, _, where = spec.partition(":")
    if kind == "gguf":
        from runtime.llama_server import model_path

        tokenizer, config = _gguf_cached(Path(where) if where else model_path())
    elif kind == "hf":
        folder = Path(where)
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config = json.loads((folder / "tokenizer_config.json").read_text())
        if (
            jinja := folder / "chat_template.jinja"
        ).exists():  # newer models keep the template beside it
            config.setdefault("chat_template", jinja.read_text())
    else:
        raise ValueError(f"unknown tokenizer source {spec!r} (expected gguf:PATH or hf:DIR)")
    if not config.get("chat_template"):
        raise ValueError(f"{spec}: no chat template")
    return ChatTokenizer(
        tokenizer,
        config["chat_template"],
        _text(config.get("bos_token")),
        _text(config.get("eos_token")),
    )
