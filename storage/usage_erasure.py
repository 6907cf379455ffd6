"""An erased person's usage rows, kept as billing records under a pseudonym (api/erasure.py's person_erased, handled
by the metering stage).

The rows are moved: copied under a random pseudonym (`erased-…`, the same for every row of the person), then
deleted under their id, with the person's daily rollup rows. ClickHouse cannot update `user_id` in place, because
it is in the table's sort key. A copy is marked `copied = 1`, and the hourly rollup's view skips marked rows: their
runs are counted there already, and the hourly rollup holds no one's id. The daily per-person rollup takes the
copies under the pseudonym. `erased_people` maps a digest of the id (never the id) to the pseudonym, so a run of
theirs that is written late (in flight at the erasure, or delivered again after a crash) is written under the
pseudonym too (storage/usage.py write)."""

from __future__ import annotations

import hashlib
import uuid

from storage.clickhouse import Backend, quote


def ddl(db: str) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS {db}.erased_people (
             user_hash String, pseudonym String, at DateTime64(3, 'UTC') DEFAULT now64(3)
           ) ENGINE = ReplacingMergeTree ORDER BY user_hash"""
    ]


def digest(user_id: str) -> str:
    return hashlib.sha256(user_id.encode()).hexdigest()


def hourly_view_current(backend: Backend, db: str) -> bool:
    """Whether the hourly rollup's view skips moved copies (a view made before erasure existed does not)."""
    rows = backend.query(
        f"SELECT create_table_query FROM system.tables WHERE database = {quote(db)} "
        "AND name = 'usage_hourly_mv'"
    )
    return bool(rows) and "copied = 0" in rows[0]["create_table_query"]


def pseudonyms(backend: Backend, db: str, user_ids: set[str]) -> dict[str, str]:
    """{user_id: pseudonym} of those among them who were erased (one query)."""
    if not user_ids:
        return {}
    by_hash = {digest(u): u for u in user_ids}
    keys = ", ".join(quote(h) for h in by_hash)
    rows = backend.query(
        f"SELECT user_hash, pseudonym FROM {db}.erased_people FINAL WHERE user_hash IN ({keys})"
    )
    return {by_hash[r["user_hash"]]: r["pseudonym"] for r in rows}


def pseudonymise(backend: Backend, db: str, user_id: str) -> tuple[str, int]:
    """Move the person's usage rows under their pseudonym (made now, or the one made at an earlier erasure);
    returns (pseudonym, rows moved)."""
    pseudonym = pseudonyms(backend, db, {user_id}).get(user_id) or f"erased-{uuid.uuid4().hex[:16]}"
    backend.insert_json(
        f"{db}.erased_people", [{"user_hash": digest(user_id), "pseudonym": pseudonym}]
    )
    who = quote(user_id)
    [count] = backend.query(f"SELECT count() AS n FROM {db}.usage FINAL WHERE user_id = {who}")
    moved = int(count["n"])
    if moved:
        backend.command(
            f"INSERT INTO {db}.usage SELECT * REPLACE ({quote(pseudonym)} AS user_id, 1 AS copied) "
            f"FROM (SELECT * FROM {db}.usage FINAL WHERE user_id = {who})"  # REPLACE's alias shadows WHERE's
        )
        for table in ("usage", "usage_daily_user"):
            backend.command(
                f"ALTER TABLE {db}.{table} DELETE WHERE user_id = {who} SETTINGS mutations_sync = 1"
            )
    return pseudonym, moved
