"""The text people write and read, sealed in every record with a key of their own (envelope encryption).

Each record type that carries a person's text names its owner (a field holding their user id) and the fields
that are theirs: prompts, answers, context, memories, passages of their documents, tool calls and results,
comments. The codec seals those fields as it encodes a record and opens them as it decodes one
(`topics/codec.py`); every other field (ids, times, counts, models, decisions) stays as it was, so standard
Kafka tools still read a record's envelope. A sealed field is a string:

    sealed:v1:<key id>:<base64url of a 12-byte nonce and the AES-GCM ciphertext>

with the key id as associated data. Whose key it is lives in the key's own record (`runtime/keys.py`), never
in the sealed text. When a person is erased their keys are deleted, and every sealed copy left anywhere (the
log, a replay, an export, a backup) opens to ERASED: the empty string, not an error.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from topics.errors import PoisonEvent

PREFIX = "sealed:v1:"
ERASED = ""  # what a field reads as once its owner's key is gone
NONCE = 12

_MESSAGE = ("content", "tool_calls")
_SOURCE = ("name", "text")
_TOOL = ("arguments", "content")
_PROMPT = (
    "content",
    *(f"messages[].{f}" for f in _MESSAGE),
    "instructions[].content",
)


def _under(prefix: str, fields: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f"{prefix}.{f}" for f in fields)


# Per record type: the field holding the owner's user id, and the owner's fields ("a[]" is every item of a).
PERSONAL: dict[str, tuple[str, tuple[str, ...]]] = {
    "PromptAccepted": ("user_id", _PROMPT),
    "PromptModerated": ("prompt.user_id", _under("prompt", _PROMPT)),
    "RunRejected": ("prompt.user_id", _under("prompt", _PROMPT)),
    "RunScheduled": (
        "prompt.user_id",
        (
            *_under("prompt", _PROMPT),
            *_under("messages[]", _MESSAGE),
            "context.memories[]",
            *_under("context.sources[]", _SOURCE),
        ),
    ),
    "RunCompleted": (
        "prompt.user_id",
        (
            *_under("prompt", _PROMPT),
            "content",
            "memories[]",
            *_under("sources[]", _SOURCE),
            *_under("tools[]", _TOOL),
        ),
    ),
    "TokenDelta": (
        "user_id",
        (
            "text",
            "memories[]",
            *_under("sources[]", _SOURCE),
            "tool_calls",
            *_under("tool_result", _TOOL),
        ),
    ),
    "MemoryChanged": ("user_id", ("content",)),
    "Feedback": ("user_id", ("comment",)),
}


class Keys(Protocol):
    """Where the codec finds data keys (runtime/keys.py Keyring)."""

    def sealing(self, owner: str) -> tuple[str, AESGCM] | None:
        """The key to seal a person's text with: (key id, cipher); None: the person is erased."""
        ...

    def opening(self, key_id: str) -> AESGCM | None:
        """The cipher of a key id; None: the key is gone (its person erased)."""
        ...


def seal_text(key_id: str, cipher: AESGCM, text: str) -> str:
    nonce = os.urandom(NONCE)
    body = cipher.encrypt(nonce, text.encode(), key_id.encode())
    return f"{PREFIX}{key_id}:{base64.urlsafe_b64encode(nonce + body).decode().rstrip('=')}"


def is_sealed(text: object) -> bool:
    return isinstance(text, str) and text.startswith(PREFIX)


def key_of(text: str) -> str:
    return text[len(PREFIX) :].split(":", 1)[0]


def open_text(text: str, keys: Keys) -> str:
    key_id, _, encoded = text[len(PREFIX) :].partition(":")
    cipher = keys.opening(key_id)
    if cipher is None:
        return ERASED
    try:
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
        return cipher.decrypt(raw[:NONCE], raw[NONCE:], key_id.encode()).decode()
    except (InvalidTag, ValueError) as exc:
        raise PoisonEvent(
            f"a sealed field under key {key_id} does not open: {type(exc).__name__}"
        ) from exc


def _get(record: Mapping[str, Any], path: str) -> Any:
    node: Any = record
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def _apply(node: Any, parts: list[str], change: Callable[[str], str]) -> Any:
    """node with the strings at parts changed; the maps and lists on the way copied, the rest shared."""
    if not parts:
        return change(node) if isinstance(node, str) and node else node
    head, rest = parts[0], parts[1:]
    many = head.endswith("[]")
    name = head[:-2] if many else head
    if not isinstance(node, Mapping) or node.get(name) is None:
        return node
    value = node[name]
    changed = (
        [_apply(item, rest, change) for item in value] if many else _apply(value, rest, change)
    )
    return {**node, name: changed}


def _each(
    record: Mapping[str, Any], fields: tuple[str, ...], change: Callable[[str], str]
) -> Mapping[str, Any]:
    for path in fields:
        record = _apply(record, path.split("."), change)
    return record


def seal(schema: str, record: Mapping[str, Any], keys: Keys) -> Mapping[str, Any]:
    """The record with its owner's fields sealed (unchanged for a type without personal text, or no owner)."""
    if schema not in PERSONAL:
        return record
    owner_field, fields = PERSONAL[schema]
    owner = _get(record, owner_field)
    if not owner:
        return record
    found: list[tuple[str, AESGCM] | None] = []

    def sealed_text(
        text: str,
    ) -> str:  # always sealed: a person's own text may look sealed, and is theirs
        if not found:  # the key is looked up (or made) only for a record with text of theirs in it
            found.append(keys.sealing(str(owner)))
        if found[0] is None:
            return ERASED  # no key: the person is erased, nothing of theirs is written
        key_id, cipher = found[0]
        return seal_text(key_id, cipher, text)

    return _each(record, fields, sealed_text)


def open_record(schema: str, record: Mapping[str, Any], keys: Keys | None) -> Mapping[str, Any]:
    """The record with its sealed fields opened (without keys: as they are, opaque)."""
    if keys is None or schema not in PERSONAL:
        return record
    return _each(record, PERSONAL[schema][1], lambda t: open_text(t, keys) if is_sealed(t) else t)
