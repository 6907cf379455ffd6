"""Usage rows in ClickHouse: one small adapter, one SQL dialect, two backends.

- embedded (default): the ClickHouse engine in-process through chdb, tables on disk in the state folder.
  One process owns a chdb data folder at a time, so only the metering stage opens it and serves queries.
- server: a ClickHouse server through clickhouse-connect (docker-compose, production).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

USAGE_COLUMNS = (
    "run_id",
    "event_id",
    "user_id",
    "tier",
    "chat_id",
    "model",
    "pool",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "ttft_ms",
    "duration_ms",
    "finish_reason",
    "created_at",
)

# ReplacingMergeTree keyed by (user_id, run_id): a replayed or redelivered RunCompleted rewrites the same row,
# and reads use FINAL, so one run is one row however often its event arrives.
DDL = (
    "CREATE DATABASE IF NOT EXISTS {db}",
    """CREATE TABLE IF NOT EXISTS {db}.usage (
         run_id String, event_id String, user_id String, tier LowCardinality(String), chat_id String,
         model LowCardinality(String), pool LowCardinality(String),
         prompt_tokens UInt32, completion_tokens UInt32, cached_tokens UInt32,
         ttft_ms Float64, duration_ms Float64, finish_reason LowCardinality(String),
         created_at DateTime64(3, 'UTC'), inserted_at DateTime64(3, 'UTC') DEFAULT now64(3)
       ) ENGINE = ReplacingMergeTree(inserted_at) ORDER BY (user_id, run_id)""",
)


def quote(value: str) -> str:
    """A ClickHouse string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Backend(Protocol):
    def command(self, sql: str) -> None: ...
    def insert_json(self, table: str, rows: list[dict[str, Any]]) -> None: ...
    def query(self, sql: str) -> list[dict[str, Any]]: ...
    def close(self) -> None: ...


class ChdbBackend:
    def __init__(self, path: Path) -> None:
        from chdb import session

        path.mkdir(parents=True, exist_ok=True)
        self._session: Any = session.Session(str(path))  # type: ignore[no-untyped-call]
        self._lock = threading.Lock()  # one chdb session, used from executor threads

    def command(self, sql: str) -> None:
        with self._lock:
            self._session.query(sql)

    def insert_json(self, table: str, rows: list[dict[str, Any]]) -> None:
        body = "\n".join(json.dumps(r, default=str) for r in rows)
        with self._lock:
            self._session.query(f"INSERT INTO {table} FORMAT JSONEachRow\n{body}")

    def query(self, sql: str) -> list[dict[str, Any]]:
        with self._lock:
            result = self._session.query(sql, "JSON")
        text = result.bytes().decode() if hasattr(result, "bytes") else str(result)
        return list(json.loads(text)["data"]) if text.strip() else []

    def close(self) -> None:
        with self._lock:
            self._session.close()


class ServerBackend:
    def __init__(self, url: str) -> None:
        import clickhouse_connect

        self._client = clickhouse_connect.get_client(dsn=url)

    def command(self, sql: str) -> None:
        self._client.command(sql)

    def insert_json(self, table: str, rows: list[dict[str, Any]]) -> None:
        body = "\n".join(json.dumps(r, default=str) for r in rows).encode()
        self._client.raw_insert(table, insert_block=body, fmt="JSONEachRow")

    def query(self, sql: str) -> list[dict[str, Any]]:
        return list(self._client.query(sql).named_results())

    def close(self) -> None:
        self._client.close()


class UsageStore:
    def __init__(self, backend: Backend, database: str) -> None:
        self.backend = backend
        self.db = database
        for statement in DDL:
            backend.command(statement.format(db=database))

    @classmethod
    def open(cls, url: str, database: str) -> UsageStore:
        """`chdb:///path/to/dir` for the embedded engine, `http://host:8123` for a server."""
        if url.startswith("chdb://"):
            return cls(ChdbBackend(Path(url.removeprefix("chdb://"))), database)
        return cls(ServerBackend(url), database)

    def write(self, rows: Iterable[dict[str, Any]]) -> int:
        batch = [{k: r[k] for k in USAGE_COLUMNS} for r in rows]
        if batch:
            self.backend.insert_json(f"{self.db}.usage", batch)
        return len(batch)

    def rows(self, where: str = "1") -> list[dict[str, Any]]:
        cols = ", ".join(USAGE_COLUMNS)
        return self.backend.query(f"SELECT {cols} FROM {self.db}.usage FINAL WHERE {where} ORDER BY created_at")

    def totals(self, user_id: str) -> dict[str, int]:
        sql = (
            "SELECT count() AS runs, sum(prompt_tokens) AS prompt_tokens, "
            "sum(completion_tokens) AS completion_tokens, sum(cached_tokens) AS cached_tokens "
            f"FROM {self.db}.usage FINAL WHERE user_id = {quote(user_id)}"
        )
        row = self.backend.query(sql)[0]
        return {k: int(row[k] or 0) for k in ("runs", "prompt_tokens", "completion_tokens", "cached_tokens")}

    def close(self) -> None:
        self.backend.close()
