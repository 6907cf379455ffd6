"""Ids, times and page cursors of the stored rows: time-ordered ids (version-1 uuids) and UTC timestamps."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime
from typing import Any

MIN_ID = uuid.UUID(int=0x00000000_0000_1000_8000_000000000000)  # the smallest timeuuid


def new_id() -> uuid.UUID:
    """A time-ordered id (version 1 with a random node, so no MAC address leaks)."""
    return uuid.uuid1(
        node=uuid.getnode() ^ int.from_bytes(uuid.uuid4().bytes[:6], "big") | 0x010000000000
    )


UUID_EPOCH = 0x01B21DD213814000  # 1582-10-15 -> 1970-01-01 in the 100 ns units of a version-1 uuid


def id_time_ms(value: uuid.UUID) -> int:
    """When a time-ordered id was minted (epoch ms), in exact integer arithmetic (the driver's
    unix_time_from_uuid1 goes through a float)."""
    return (value.time - UUID_EPOCH) // 10_000


def id_time_us(value: uuid.UUID) -> int:
    """When a time-ordered id was minted, in epoch microseconds (the unit of Cassandra's write timestamps)."""
    return (value.time - UUID_EPOCH) // 10


def parse_id(value: str) -> uuid.UUID | None:
    try:
        parsed = uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        return None
    return parsed if parsed.version == 1 else None


def encode_cursor(value: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> dict[str, Any] | None:
    try:
        value = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, TypeError):
        return None
    return value if isinstance(value, dict) else None


def epoch_ms(value: datetime) -> int:
    return round(utc(value).timestamp() * 1000)


def utc(value: datetime) -> datetime:
    """The driver returns naive datetimes that are UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def now() -> datetime:
    """Millisecond precision: Cassandra timestamps hold milliseconds, and activity rows are matched on equality."""
    at = datetime.now(UTC)
    return at.replace(microsecond=at.microsecond // 1000 * 1000)
