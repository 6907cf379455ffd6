"""Avro encoding of events (fastavro, schemaless binary; the schema name and version travel in headers).

The `.avsc` files in schemas/ are the source of truth. Records are plain dicts.
"""

from __future__ import annotations

import io
import json
import time
from functools import cache
from pathlib import Path
from typing import Any

import fastavro
from fastavro.types import Schema

from topics.errors import PoisonEvent

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
# Order matters only for named types referenced by others; parse_schema resolves against this store.
_DEPENDENCIES = ("Usage", "ChatMessage", "PromptAccepted")

Event = dict[str, Any]


def _load(directory: Path, name: str, named: dict[str, Any]) -> Schema:
    raw = json.loads((directory / f"{name}.avsc").read_text())
    return fastavro.parse_schema(raw, named_schemas=named)


@cache
def schemas(directory: Path = SCHEMA_DIR) -> dict[str, Schema]:
    named: dict[str, Any] = {}
    parsed: dict[str, Schema] = {}
    for name in _DEPENDENCIES:
        parsed[name] = _load(directory, name, named)
    for path in sorted(directory.glob("*.avsc")):
        if path.stem not in parsed:
            parsed[path.stem] = _load(directory, path.stem, named)
    return parsed


def token_delta(run: Event, seq: int, kind: str, **fields: Any) -> Event:
    """A TokenDelta record of a scheduled run: every optional field empty unless given."""
    prompt = run["prompt"]
    return {
        "run_id": prompt["run_id"],
        "chat_id": prompt["chat_id"],
        "seq": seq,
        "kind": kind,
        "text": "",
        "model": None,
        "finish_reason": None,
        "usage": None,
        "error_code": None,
        "error_message": None,
        "tokens": None,
        "pool": None,
        "estimated_wait_ms": None,
        "degraded_from": None,
        "category": None,
        "retract_from": None,
        "emitted_at": int(time.time() * 1000),
        **fields,
    }


def encode(schema_name: str, record: Event) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schemas()[schema_name], record)
    return buf.getvalue()


def decode(schema_name: str, payload: bytes | None) -> Event:
    if not payload:
        raise PoisonEvent(f"empty {schema_name} payload")
    buf = io.BytesIO(payload)
    try:
        record = fastavro.schemaless_reader(buf, schemas()[schema_name], None)
    except Exception as exc:  # fastavro raises many types on garbage input
        raise PoisonEvent(f"undecodable {schema_name}: {type(exc).__name__}") from exc
    if buf.tell() != len(payload) or not isinstance(record, dict):
        raise PoisonEvent(f"trailing or malformed bytes in {schema_name}")
    return record
