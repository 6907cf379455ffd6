"""The audit log in ClickHouse: one row per audit event (api/audit.py), written by the metering stage.

Rows expire after the audit period (PARLEY_RETAIN_AUDIT_DAYS, 400 by default: the audit record outlives every
conversation; storage/usage.py EXPIRING) and a redelivered
event replaces its own row (ReplacingMergeTree on the event's id), so a batch written twice after a crash is
still one row per event. Only the owner and auditors read it, through the edge (GET /v1/admin/audit).
"""

from __future__ import annotations

from typing import Any

from storage.clickhouse import Backend, iso, moment, quote

COLUMNS = (
    "event_id",
    "at",
    "actor",
    "actor_role",
    "action",
    "target_user",
    "resource",
    "from_addr",
    "detail",
)


def ddl(db: str) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS {db}.audit_log (
             event_id String, at DateTime64(3, 'UTC'), actor String, actor_role LowCardinality(String),
             action LowCardinality(String), target_user String, resource String, from_addr String, detail String
           ) ENGINE = ReplacingMergeTree ORDER BY (toDate(at), event_id)"""
    ]


def write(backend: Backend, db: str, events: list[dict[str, Any]]) -> None:
    rows = [{**{k: e.get(k) or "" for k in COLUMNS}, "at": iso(e["at"])} for e in events]
    if rows:
        backend.insert_json(f"{db}.audit_log", rows)


def read(
    backend: Backend,
    db: str,
    since_ms: int,
    until_ms: int,
    actor: str = "",
    target_user: str = "",
    action: str = "",
    limit: int = 200,
) -> list[dict[str, Any]]:
    """Newest first, within [since, until), optionally of one actor, one person touched or one action."""
    where = [f"at >= {moment(since_ms)}", f"at < {moment(until_ms)}"]
    for column, value in (("actor", actor), ("target_user", target_user), ("action", action)):
        if value:
            where.append(f"{column} = {quote(value)}")
    return backend.query(
        f"SELECT {', '.join(COLUMNS)} FROM {db}.audit_log FINAL WHERE {' AND '.join(where)} "
        f"ORDER BY at DESC LIMIT {int(limit)}"
    )
