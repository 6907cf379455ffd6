"""A person's text sealed in the tables as in the log: with their own data key (topics/sealed.py, runtime/keys.py),
so the copies a table leaves on disk after a delete (until compaction and gc_grace have run) open for no one
once the person is erased, whatever a node's disk, a snapshot or a repair stream still holds.

Sealed here: a chat's messages (their text, an answer's memories, passages and tool calls), the person's
edits of them, chat titles, the chat's memory (the text beside each embedding) and summaries, its documents
(the file's name and bytes, the passages read from it), the memories a person keeps, and their own instructions.
The store seals as it writes, knowing the owner, and opens as it reads by the key id each sealed value names; a
value written before sealing, or by a process without keys, reads as it is.
Left unsealed on purpose: embeddings (their approximate-nearest-neighbour index needs the vectors) and the
search store's text (its full-text index needs the words), both deleted on erasure (docs/privacy.md).
"""

from __future__ import annotations

import os
from typing import Any

from cryptography.exceptions import InvalidTag

from topics import codec
from topics.errors import PoisonEvent
from topics.sealed import ERASED, NONCE, PREFIX, is_sealed, open_text, seal_text

_BYTES = PREFIX.encode()  # a sealed blob: PREFIX, the key id, ":", the nonce, then the ciphertext


def seal(owner: str, text: str | None) -> str | None:
    """The text sealed with its owner's key (as it is without keys, an owner or text; ERASED for an erased
    owner: nothing of theirs is written)."""
    keys = codec.keys()
    if keys is None or not owner or not text:
        return text
    found = keys.sealing(owner)
    if found is None:
        return ERASED
    return seal_text(found[0], found[1], text)


def opened(value: Any) -> Any:
    """A value as written before it was sealed (ERASED once its owner's key is gone)."""
    keys = codec.keys()
    if keys is None or not isinstance(value, str) or not is_sealed(value):
        return value
    return open_text(value, keys)


def seal_bytes(owner: str, data: bytes) -> bytes:
    """A blob sealed with its owner's key, as `seal` seals text (b"" for an erased owner)."""
    keys = codec.keys()
    if keys is None or not owner or not data:
        return data
    found = keys.sealing(owner)
    if found is None:
        return b""
    key_id, cipher = found
    nonce = os.urandom(NONCE)
    return _BYTES + key_id.encode() + b":" + nonce + cipher.encrypt(nonce, data, key_id.encode())


def opened_bytes(data: bytes) -> bytes:
    """A blob as written before it was sealed (b"" once its owner's key is gone)."""
    keys = codec.keys()
    if keys is None or not data.startswith(_BYTES):
        return data
    key_id, _, raw = data[len(_BYTES) :].partition(b":")
    cipher = keys.opening(key_id.decode())
    if cipher is None:
        return b""
    try:
        return cipher.decrypt(raw[:NONCE], raw[NONCE:], key_id)
    except InvalidTag as exc:
        raise PoisonEvent(f"a sealed blob under key {key_id.decode()} does not open") from exc
