"""Avro encoding of events in the Kafka ecosystem's wire format, with every record naming its writer's schema.

A record is a zero byte, the writer schema's id in the schema registry (4 bytes, big-endian) and the Avro
binary body (fastavro, schemaless): what Confluent's serializers write, so standard Kafka tools read our topics.
Decoding resolves the writer's schema (fetched by id, then kept) against the reader's (schemas/*.avsc), so a
record written by an older or newer producer, or read back from last month's log, reads correctly. The `.avsc`
files in schemas/ are the source of truth; each is registered under its record's full name (the
RecordNameStrategy: one schema serves several topics), fully expanded (named types inlined where first used).

The registry connection is process-wide, set once by each deployable's main (`use`): the encode/decode calls
sit deep in pure stage code, and a writer-schema cache shared by the whole process is what makes decoding
cheap (docs/decisions/0011-replicated-data-plane.md).
"""

from __future__ import annotations

import io
import json
import struct
import time
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, Protocol

import fastavro
from fastavro.types import Schema

from topics import sealed
from topics.errors import PoisonEvent, RetriableError

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
# Order matters only for named types referenced by others; parse_schema resolves against this store.
_DEPENDENCIES = ("Usage", "ChatMessage", "Source", "ToolUse", "PromptAccepted")
MAGIC = 0
HEADER = struct.Struct(">bI")  # magic byte, schema id

Event = Mapping[str, Any]  # a record as read or built; its own type is in topics/events.py


def _raw(directory: Path) -> dict[str, dict[str, Any]]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(directory.glob("*.avsc"))}


def plain(node: Any) -> Any:
    """A schema as this process reads and writes it: a timestamp-millis is the long it is on the wire, epoch
    milliseconds. So a timestamp is one type end to end: an int, as written and as read back (fastavro would
    otherwise read it as a datetime). The schemas registered keep their logical types (`expanded`)."""
    if isinstance(node, dict):
        if node.get("logicalType") == "timestamp-millis":
            return {k: plain(v) for k, v in node.items() if k != "logicalType"}
        return {k: plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [plain(item) for item in node]
    return node


@cache
def schemas(directory: Path = SCHEMA_DIR) -> dict[str, Schema]:
    raw = _raw(directory)
    named: dict[str, Any] = {}
    parsed: dict[str, Schema] = {}
    first = [
        n for n in _DEPENDENCIES if n in raw
    ]  # an older set of schemas may lack the newer ones
    for name in (*first, *(n for n in raw if n not in first)):
        parsed[name] = fastavro.parse_schema(plain(raw[name]), named_schemas=named)
    return parsed


def full_name(schema: dict[str, Any]) -> str:
    name = str(schema["name"])
    return name if "." in name or not schema.get("namespace") else f"{schema['namespace']}.{name}"


@cache
def expanded(name: str, directory: Path = SCHEMA_DIR) -> str:
    """The schema of one record type as registered: standalone JSON, every named type it uses defined inline
    where it first appears and referred to by name after."""
    raw = _raw(directory)
    definitions = {full_name(s): s for s in raw.values()}
    seen: set[str] = set()

    def inline(node: Any) -> Any:
        if isinstance(node, str) and node in definitions and node not in seen:
            return inline(definitions[node])
        if isinstance(node, list):
            return [inline(item) for item in node]
        if isinstance(node, dict):
            if node.get("type") in ("record", "enum", "fixed") and "name" in node:
                seen.add(full_name(node))
            return {
                key: inline(value) if key in ("type", "items", "values", "fields") else value
                for key, value in node.items()
            }
        return node

    return json.dumps(inline(raw[name]), separators=(",", ":"))


def subject(name: str) -> str:
    """The registry subject of a record type (RecordNameStrategy)."""
    return full_name(_raw(SCHEMA_DIR)[name])


class Registry(Protocol):
    """What the codec needs of a schema registry: register a schema under a subject (its id), and fetch the
    schema of an id (None: no such id)."""

    def register(self, subject: str, schema: str) -> int: ...

    def fetch(self, schema_id: int) -> str | None: ...


class Schemas:
    """Ids of our record types (registered once, then kept) and the writer schemas of ids read (kept)."""

    def __init__(self, registry: Registry, retry_s: float = 60.0) -> None:
        self.registry = registry
        self.retry_s = retry_s
        self._ids: dict[str, int] = {}
        self._writers: dict[int, Schema] = {}

    def register_all(self) -> dict[str, int]:
        """Register every record type now (a process does this at start-up, so that it keeps producing on the
        ids it holds if the registry goes away later); fails when a schema is incompatible with its subject."""
        return {name: self.id_for(name) for name in schemas()}

    def id_for(self, name: str) -> int:
        if name not in self._ids:
            register = lambda: self.registry.register(subject(name), expanded(name))  # noqa: E731
            schema_id = self._ids[name] = self._retrying(f"register {name}", register)
            # The id names the schema `encode` writes with: records written with it are read without asking the
            # registry, so a process that has not read a type since it started still reads it while it is away.
            self._writers.setdefault(schema_id, schemas()[name])
        return self._ids[name]

    def writer(self, schema_id: int) -> Schema:
        if schema_id not in self._writers:
            text = self._retrying(
                f"fetch schema {schema_id}", lambda: self.registry.fetch(schema_id)
            )
            if text is None:
                raise PoisonEvent(f"unknown schema id {schema_id}: the registry has no such schema")
            self._writers[schema_id] = fastavro.parse_schema(plain(json.loads(text)))
        return self._writers[schema_id]

    def _retrying(self, what: str, call: Any) -> Any:
        deadline = time.monotonic() + self.retry_s
        while True:
            try:
                return call()
            except (ConnectionError, OSError, RetriableError) as exc:
                if time.monotonic() > deadline:
                    raise RetriableError(f"schema registry unreachable ({what}): {exc}") from exc
                time.sleep(0.5)


_schemas: Schemas | None = None


def use(registry: Schemas) -> Schemas:
    """Set this process's schema registry (once, in main)."""
    global _schemas
    _schemas = registry
    return registry


_keys: sealed.Keys | None = None


def use_keys(keys: sealed.Keys | None) -> None:
    """Set this process's data keys (once, in main, after `use`): from then on the text a record carries for a
    person is sealed as it is encoded and opened as it is decoded (topics/sealed.py). None: written and read
    as it is (a process that holds no keys sees sealed fields as they are on the wire)."""
    global _keys
    _keys = keys


def keys() -> sealed.Keys | None:
    """This process's data keys (None: it holds none), for the stores that seal text at rest too."""
    return _keys


def registry() -> Schemas:
    if _schemas is None:
        raise RuntimeError("no schema registry set for this process (topics.codec.use, from main)")
    return _schemas


def encode(schema_name: str, record: Event) -> bytes:
    buf = io.BytesIO()
    buf.write(HEADER.pack(MAGIC, registry().id_for(schema_name)))
    if _keys is not None:
        record = sealed.seal(schema_name, record, _keys)
    fastavro.schemaless_writer(buf, schemas()[schema_name], record)
    return buf.getvalue()


def writer_id(payload: bytes) -> int:
    """The id of the schema that wrote a record (PoisonEvent: not in the wire format)."""
    if len(payload) < HEADER.size or payload[0] != MAGIC:
        raise PoisonEvent("not in the schema registry's wire format (no magic byte and schema id)")
    return int(HEADER.unpack_from(payload)[1])


def decode(schema_name: str, payload: bytes | None) -> Event:
    if not payload:
        raise PoisonEvent(f"empty {schema_name} payload")
    writer = registry().writer(writer_id(payload))
    buf = io.BytesIO(payload)
    buf.seek(HEADER.size)
    try:
        record = fastavro.schemaless_reader(buf, writer, schemas()[schema_name])
    except (
        Exception
    ) as exc:  # fastavro raises many types on garbage input or schemas that cannot resolve
        raise PoisonEvent(
            f"undecodable {schema_name}: {type(exc).__name__}: {str(exc)[:200]}"
        ) from exc
    if buf.tell() != len(payload) or not isinstance(record, dict):
        raise PoisonEvent(f"trailing or malformed bytes in {schema_name}")
    return sealed.open_record(schema_name, record, _keys)
