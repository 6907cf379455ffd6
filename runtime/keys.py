"""Each person's data keys: made by the edge, wrapped by the key-encryption key, kept in a compacted topic that
every process reads whole, deleted when the person is erased (docs/privacy.md, topics/sealed.py).

The key-encryption key (KEK) comes from the settings (PARLEY_KEK, or a file such as a mounted Kubernetes
Secret) and never leaves the process: the topic holds only wrapped keys, each naming the KEK's fingerprint.
A process refuses to start without a KEK, with a malformed one, or with one that did not wrap the keys on
the topic. Unwrapped keys are cached for the life of the process and checked against the table on every use,
so a deleted key stops opening text at once everywhere the tombstone has been read.

Why a compacted topic rather than a table or a KMS's store: every process that handles a person's text (the
inference consumers and the moderation stage have no Cassandra session) already reads tables from the log,
the delete reaches every replica in milliseconds, and compaction removes the key from the broker's disk
within the topic's segment and tombstone periods (topics/pipeline.py PERSON_KEYS).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import threading
from typing import cast

from confluent_kafka import KafkaError, KafkaException, Producer
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from runtime.kafka import DELIVERY_TIMEOUT_MS, producer_config
from runtime.settings import StackSettings
from runtime.tables import TopicTable
from topics import codec
from topics.clock import now_ms
from topics.codec import Event
from topics.errors import FatalError, RetriableError
from topics.events import PersonKey
from topics.pipeline import PERSON_KEYS, Topic, check_publish, named

log = logging.getLogger(__name__)


class KeysUnavailable(RetriableError):
    """A person's key could not be made or found: nothing of theirs is written (the edge answers 503)."""


class BadKek(FatalError):
    """The key-encryption key is missing, malformed, or not the one that wrapped the keys: refuse to start."""


def kek_bytes(value: str) -> bytes:
    """The KEK from its setting: base64 (standard or url-safe) of exactly 32 bytes."""
    if not value.strip():
        raise BadKek(
            "no key-encryption key: set PARLEY_KEK (or PARLEY_KEK_FILE) to base64 of 32 random bytes, e.g. "
            "`openssl rand -base64 32`; the local stack makes one (infra/stack.py)"
        )
    text = value.strip().replace("-", "+").replace("_", "/").rstrip("=")
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadKek("PARLEY_KEK is not base64") from exc
    if len(raw) != 32:
        raise BadKek(f"PARLEY_KEK is {len(raw)} bytes; it must be 32 (AES-256)")
    return raw


def fingerprint(kek: bytes) -> str:
    """A KEK's public name: which key wrapped a data key, without revealing it."""
    return hashlib.sha256(b"parley-kek-id\0" + kek).hexdigest()[:16]


def _aad(key_id: str, user_id: str) -> bytes:
    return f"{key_id}\0{user_id}".encode()


class Keyring(TopicTable):
    """The table of data keys, and the codec's source of them (topics/sealed.py Keys). `creates`: this process
    may make and delete keys (the edge, and the tools acting as it)."""

    def __init__(
        self, bootstrap: str, namespace: str, reader: str, kek: str, *, creates: bool = False
    ) -> None:
        super().__init__(bootstrap, PERSON_KEYS, namespace, reader)
        raw = kek_bytes(kek)
        self._kek = AESGCM(raw)
        self.kek_id = fingerprint(raw)
        self._owners: dict[str, dict[str, int]] = {}  # user_id -> key_id -> created_at
        self._ciphers: dict[str, AESGCM] = {}
        self._gone: set[str] = set()
        self._lock = threading.Lock()
        self.reader = reader
        # as patient as every other write of the edge: a broker's death and its partitions' new leaders
        self.write_timeout_s = DELIVERY_TIMEOUT_MS / 1000
        self._producer: Producer | None = None
        if creates:
            check_publish(reader, PERSON_KEYS)
            self._producer = Producer(producer_config(bootstrap))

    def start(self, timeout_s: float = 30.0) -> None:
        super().start(timeout_s)
        foreign = {str(r["kek_id"]) for r in self.rows().values()} - {self.kek_id}
        if foreign:
            raise BadKek(
                f"PARLEY_KEK (fingerprint {self.kek_id}) did not wrap the data keys on {self.name} (wrapped by "
                f"{', '.join(sorted(foreign))}): this is not the deployment's key-encryption key"
            )
        # the fingerprint matches: the first key unwraps, or BadKek
        for key_id in list(self.rows())[:1]:
            self._cipher(key_id)

    def _apply(self, key: str, record: Event | None) -> None:
        with self._lock:
            old = self._rows.get(key)
            if old is not None:
                self._owners.get(str(old["user_id"]), {}).pop(key, None)
            super()._apply(key, record)
            if record is None:
                self._ciphers.pop(key, None)
                self._gone.add(key)
            else:
                owned = self._owners.setdefault(str(record["user_id"]), {})
                owned[key] = int(record["created_at"])

    def stop(self) -> None:
        super().stop()
        if self._producer is not None:
            self._producer.flush(1)
            self._producer = None  # its connections close with it

    # the codec's side (topics/sealed.py Keys)

    def sealing(self, owner: str) -> tuple[str, AESGCM] | None:
        key_id = self._newest(owner)
        if key_id is None and self._producer is not None:
            key_id = self._make(owner)
        if key_id is None:
            if not self.catch_up():
                raise KeysUnavailable(f"the keys on {self.name} could not be read to their end")
            key_id = self._newest(owner)
        if key_id is None:
            return None  # erased: nothing of theirs may be written
        cipher = self._cipher(key_id)
        return (key_id, cipher) if cipher is not None else None

    def opening(self, key_id: str) -> AESGCM | None:
        if key_id not in self._rows and key_id not in self._gone:
            if (
                not self.catch_up()
            ):  # a key made moments ago by another process: never guess it is gone
                raise KeysUnavailable(f"the keys on {self.name} could not be read to their end")
            if key_id not in self._rows:
                self._gone.add(key_id)  # read to the end and not there: deleted, or never made
        return self._cipher(key_id)

    def _newest(self, owner: str) -> str | None:
        with self._lock:
            owned = self._owners.get(owner)
            return max(owned, key=owned.__getitem__) if owned else None

    def _cipher(self, key_id: str) -> AESGCM | None:
        record = self._rows.get(key_id)
        if record is None:
            return None
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            wrapped = bytes(record["wrapped"])
            try:
                raw = self._kek.decrypt(
                    wrapped[:12], wrapped[12:], _aad(key_id, str(record["user_id"]))
                )
            except InvalidTag as exc:
                raise BadKek(
                    f"data key {key_id} does not unwrap with PARLEY_KEK (fingerprint {self.kek_id})"
                ) from exc
            cipher = self._ciphers[key_id] = AESGCM(raw)
        return cipher

    # the edge's side

    def _make(self, owner: str) -> str:
        key_id = os.urandom(8).hex()
        nonce = os.urandom(12)
        record = {
            "key_id": key_id,
            "user_id": owner,
            "kek_id": self.kek_id,
            "wrapped": nonce + self._kek.encrypt(nonce, os.urandom(32), _aad(key_id, owner)),
            "created_at": now_ms(),
        }
        self.publish(PERSON_KEYS, key_id, codec.encode(PERSON_KEYS.schema, cast(PersonKey, record)))
        log.info("made a data key %s for a person", key_id)
        return key_id

    def erase(self, owner: str) -> int:
        """Delete every data key of a person (tombstones, read back before returning): all text sealed with them
        now reads as erased, wherever it is. Returns how many keys were deleted."""
        if not self.catch_up():  # a key another edge replica made moments ago is theirs too
            raise KeysUnavailable(f"the keys on {self.name} could not be read to their end")
        with self._lock:
            owned = list(self._owners.get(owner, {}))
        for key_id in owned:
            self.publish(PERSON_KEYS, key_id, None)
        if owned and not self.catch_up():
            raise KeysUnavailable(f"the deleted keys were not read back from {self.name}")
        return len(owned)

    def publish(self, topic: Topic[PersonKey], key_id: str, value: bytes | None) -> None:
        """Write a key (or its tombstone) and wait for the log to take it."""
        if self._producer is None:
            raise RuntimeError("this process does not make or delete data keys")
        check_publish(self.reader, topic)
        failed: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                failed.append(err)

        self._producer.produce(self.name, key=key_id.encode(), value=value, on_delivery=delivered)
        try:
            left = self._producer.flush(self.write_timeout_s)
        except KafkaException as exc:
            raise KeysUnavailable(f"{self.name}: {exc}") from exc
        if left or failed:
            raise KeysUnavailable(
                f"{self.name}: {failed[0] if failed else 'not acknowledged in time'}"
            )
        if value is not None:
            self._apply(
                key_id, codec.decode(topic.schema, value)
            )  # ours at once, before the view reads it


def check(settings: StackSettings) -> None:
    """Refuse to start, saying why, when sealing is on and the KEK is missing or malformed."""
    if settings.seal_text:
        try:
            kek_bytes(settings.kek_value())
        except (BadKek, OSError) as exc:
            raise SystemExit(f"refusing to start: {exc}") from None


def start(settings: StackSettings, reader: str, *, creates: bool = False) -> Keyring | None:
    """This process's keyring, read to its end and given to the codec (None: sealing is off)."""
    if not settings.seal_text:
        log.warning("PARLEY_SEAL_TEXT is off: people's text goes to the log unsealed")
        codec.use_keys(None)
        return None
    namespace = settings.namespace
    keys = Keyring(
        settings.kafka_bootstrap, namespace, reader, settings.kek_value(), creates=creates
    )
    keys.start()
    codec.use_keys(keys)
    log.info(
        "person keys of %s: %d read (KEK %s)",
        named(PERSON_KEYS, namespace),
        len(keys.rows()),
        keys.kek_id,
    )
    return keys
