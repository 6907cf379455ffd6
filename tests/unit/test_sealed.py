"""A person's text is sealed with their key in every record the codec writes, opened as it reads, opaque to a
reader without keys, and reads as erased once the key is gone (topics/sealed.py; the keys' own table and the
log: tests/stack/test_erasure.py)."""

from __future__ import annotations

import base64
import os

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from runtime import keys as person_keys
from runtime.settings import StackSettings
from topics import codec, sealed
from topics.errors import PoisonEvent
from topics.records import token_delta

from .fakes import completed, prompt

PLANTED = "the marmalade sky over Quillfeather Lane"


class Keys:
    """The codec's side of the keys, kept in a dict (the keyring itself reads them from the log)."""

    def __init__(self) -> None:
        self.ciphers: dict[str, AESGCM] = {}
        self.owners: dict[str, str] = {}
        self.made = 0

    def sealing(self, owner: str):
        if owner not in self.owners:
            self.made += 1
            self.owners[owner] = key_id = os.urandom(8).hex()
            self.ciphers[key_id] = AESGCM(os.urandom(32))
        key_id = self.owners[owner]
        return (key_id, self.ciphers[key_id]) if key_id in self.ciphers else None

    def opening(self, key_id: str):
        return self.ciphers.get(key_id)

    def erase(self, owner: str) -> None:
        self.ciphers.pop(self.owners[owner])


@pytest.fixture
def keys():
    held = Keys()
    codec.use_keys(held)
    yield held
    codec.use_keys(None)


def opaque(schema: str, payload: bytes):
    """What a reader without keys (a standard Kafka tool) sees."""
    held = codec._keys
    codec.use_keys(None)
    try:
        return codec.decode(schema, payload)
    finally:
        codec.use_keys(held)


def test_a_prompt_is_sealed_on_the_wire_opened_with_the_key_and_its_envelope_stays_readable(keys):
    p = prompt(
        content=PLANTED,
        messages=[{"role": "user", "content": f"earlier: {PLANTED}"}],
        instructions=[{"source": "person", "content": f"always mention {PLANTED}"}],
    )
    payload = codec.encode("PromptAccepted", p)
    assert PLANTED.encode() not in payload and b"Quillfeather" not in payload
    assert codec.decode("PromptAccepted", payload) == p
    seen = opaque("PromptAccepted", payload)
    assert seen["chat_id"] == p["chat_id"] and seen["user_id"] == "u" and seen["max_tokens"] == 16
    assert sealed.is_sealed(seen["content"]) and sealed.is_sealed(seen["messages"][0]["content"])
    assert sealed.is_sealed(seen["instructions"][0]["content"])
    assert seen["messages"][0]["role"] == "user" and seen["instructions"][0]["source"] == "person"


def test_every_copy_of_a_persons_text_reads_as_erased_once_their_key_is_gone_and_others_are_untouched(
    keys,
):
    mine = prompt(content=PLANTED, user_id="erased-one")
    theirs = prompt(content="a note about otters", user_id="someone-else")
    answer = completed(
        mine,
        content=f"About {PLANTED}.",
        memories=[f"likes {PLANTED}"],
        sources=[{"n": 1, "document_id": "d", "name": "lane.pdf", "place": "", "text": PLANTED}],
        tools=[{"call_id": "c", "name": "look", "arguments": PLANTED, "status": "ok", "content": PLANTED}],
    )
    written = [codec.encode("RunCompleted", answer), codec.encode("PromptAccepted", mine)]
    other = codec.encode("PromptAccepted", theirs)
    assert all(PLANTED.encode() not in w for w in written)
    assert codec.decode("RunCompleted", written[0]) == answer
    keys.erase("erased-one")
    gone = codec.decode("RunCompleted", written[0])
    assert gone["content"] == gone["prompt"]["content"] == "" and gone["memories"] == [""]
    assert gone["sources"][0]["text"] == gone["tools"][0]["arguments"] == ""
    assert gone["prompt"]["run_id"] == mine["run_id"] and gone["usage"] == answer["usage"]
    assert codec.decode("PromptAccepted", other)["content"] == "a note about otters"
    late = codec.decode("PromptAccepted", codec.encode("PromptAccepted", mine))
    assert late["content"] == ""  # written after the erasure: nothing of theirs reaches the log


def test_the_reply_stream_is_sealed_under_the_runs_owner(keys):
    scheduled = {"prompt": prompt(user_id="streamer")}
    delta = token_delta(scheduled, 3, "delta", text=PLANTED)  # type: ignore[arg-type]
    payload = codec.encode("TokenDelta", delta)
    assert PLANTED.encode() not in payload
    assert codec.decode("TokenDelta", payload)["text"] == PLANTED
    assert opaque("TokenDelta", payload)["run_id"] == delta["run_id"]


def test_a_key_is_looked_up_only_for_a_record_with_text_and_text_that_looks_sealed_stays_the_persons(
    keys,
):
    control = {"event_id": "e", "run_id": "r", "chat_id": "c", "user_id": "x", "action": "cancel"}
    codec.encode("RunControl", {**control, "requested_at": 1})
    empty = prompt(content="", user_id="quiet")
    codec.encode("PromptAccepted", empty)
    assert keys.made == 0  # no text of theirs: no key made
    lookalike = "sealed:v1:0011223344556677:AAAA"
    p = prompt(content=lookalike)
    assert codec.decode("PromptAccepted", codec.encode("PromptAccepted", p))["content"] == lookalike


def test_a_tampered_sealed_field_is_a_poison_record_not_plaintext(keys):
    payload = bytearray(codec.encode("PromptAccepted", prompt(content=PLANTED)))
    sealed_at = payload.find(b"sealed:v1:")
    payload[sealed_at + 40] ^= 1  # a character of the ciphertext
    with pytest.raises(PoisonEvent, match="does not open"):
        codec.decode("PromptAccepted", bytes(payload))


def test_with_the_keys_out_of_reach_nothing_of_a_persons_is_encoded_sealed_or_not():
    ring = person_keys.Keyring("127.0.0.1:9", "t", "api", base64.b64encode(os.urandom(32)).decode(), creates=True)
    ring.write_timeout_s = 1.0  # no broker listens there: the new key is never acknowledged
    codec.use_keys(ring)
    try:
        with pytest.raises(person_keys.KeysUnavailable, match="not acknowledged in time"):
            codec.encode("PromptAccepted", prompt(content=PLANTED, user_id="new-person"))
    finally:
        codec.use_keys(None)


def test_a_process_refuses_to_start_without_a_key_encryption_key_or_with_a_malformed_one(tmp_path):
    with pytest.raises(SystemExit, match="no key-encryption key: set PARLEY_KEK"):
        person_keys.check(StackSettings(kek="", kek_file=""))
    with pytest.raises(SystemExit, match="16 bytes; it must be 32"):
        person_keys.check(StackSettings(kek="A" * 22))
    with pytest.raises(SystemExit, match="not base64"):
        person_keys.check(StackSettings(kek="not base64 at all!"))
    (tmp_path / "kek").write_text("QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWY=\n")
    person_keys.check(StackSettings(kek_file=str(tmp_path / "kek")))  # 32 bytes from a mounted Secret
    person_keys.check(StackSettings(kek="", seal_text=False))  # sealing off: nothing to check
    a, b = os.urandom(32), os.urandom(32)
    assert person_keys.fingerprint(a) == person_keys.fingerprint(a) != person_keys.fingerprint(b)


def test_a_stored_message_is_sealed_at_rest_with_its_owners_key_and_opens_as_it_was(keys):
    import json
    import uuid
    from collections import namedtuple
    from datetime import UTC, datetime

    from storage.rows import MESSAGE_COLUMNS, Message, message_of, message_row

    message = Message(
        str(uuid.uuid1()), "assistant", PLANTED, datetime.now(UTC), memories=(PLANTED,),
        sources=({"name": "notes.txt", "text": PLANTED},), tools=({"name": "lookup", "content": PLANTED},),
    )  # fmt: skip
    written = message_row(message, "ada")
    assert PLANTED not in json.dumps(written, default=str) and sealed.is_sealed(written[2])
    Row = namedtuple("Row", [c.strip() for c in MESSAGE_COLUMNS.split(",")])
    values = dict(
        zip(("message_id", "role", "content", "created_at", "run_id", "model", "finish_reason", "pool"), written)
    )
    row = Row(**values, feedback=None, parent_id=None, memories=written[9], sources=written[10], tools=written[11])
    assert message_of(row) == message
    keys.erase("ada")
    gone = message_of(row)
    assert gone.content == sealed.ERASED and gone.memories == (sealed.ERASED,)
    assert message_row(message, "")[2] == PLANTED  # no owner (a tool writing rows of nobody's): as it is


def test_a_documents_file_is_sealed_at_rest_as_bytes_and_a_tampered_one_is_poison(keys):
    from storage import at_rest

    data = f"%PDF-1.7 {PLANTED}".encode() + bytes(range(256))
    written = at_rest.seal_bytes("ada", data)
    assert PLANTED.encode() not in written and written.startswith(sealed.PREFIX.encode())
    assert at_rest.opened_bytes(written) == data and at_rest.seal_bytes("ada", data) != written  # a fresh nonce
    assert at_rest.opened_bytes(data) == data  # written before sealing: as it is
    with pytest.raises(PoisonEvent):
        at_rest.opened_bytes(written[:-1] + bytes([written[-1] ^ 1]))
    keys.erase("ada")
    assert at_rest.opened_bytes(written) == b"" and at_rest.seal_bytes("ada", data) == b""
