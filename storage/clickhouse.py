"""The ClickHouse engine, two ways, one SQL dialect: embedded in-process through chdb (default; tables on disk in
the state folder; one process owns a data folder at a time, so only the metering stage opens it and serves
queries) or a ClickHouse server through clickhouse-connect (docker-compose, production). And the SQL helpers
the usage tables and the report share. Design: docs/decisions/0009-usage-metering.md."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol


def in_buckets(bucket: str, column: str, since_ms: int, until_ms: int) -> str:
    """`column` within the buckets (`bucket`: toStartOfHour, toDate) that [since, until) touches."""
    return f"{column} >= {bucket}({moment(since_ms)}) AND {column} <= {bucket}({moment(until_ms)})"


def quote(value: str) -> str:
    """A ClickHouse string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def moment(ms: int) -> str:
    """Epoch milliseconds as a DateTime64(3) literal."""
    return f"fromUnixTimestamp64Milli({int(ms)}, 'UTC')"


_EXACT = "output_format_json_quote_64bit_integers = 1, output_format_json_quote_decimals = 1"


class Backend(Protocol):
    def command(self, sql: str) -> None: ...
    def insert_json(self, table: str, rows: list[dict[str, Any]]) -> None: ...
    def query(self, sql: str) -> list[dict[str, Any]]: ...
    def dump(self, sql: str) -> str:
        """The rows of a query as JSONEachRow text, every number as written (64-bit integers and decimals quoted,
        so no float stands between them and their restore)."""
        ...

    def close(self) -> None: ...


class ChdbBackend:
    def __init__(self, path: Path) -> None:
        from chdb import session

        path.mkdir(parents=True, exist_ok=True)
        self._session: Any = session.Session(str(path))  # type: ignore[no-untyped-call]
        self._lock = threading.Lock()  # one chdb session, used from executor threads
        # JSON output quotes 64-bit integers and decimals as strings unless told not to (a server's client
        # returns them as numbers)
        for setting in (
            "output_format_json_quote_64bit_integers",
            "output_format_json_quote_decimals",
        ):
            self._session.query(f"SET {setting} = 0")  # type: ignore[no-untyped-call]

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

    def dump(self, sql: str) -> str:
        with self._lock:
            result = self._session.query(f"{sql} SETTINGS {_EXACT}", "JSONEachRow")
        return result.bytes().decode() if hasattr(result, "bytes") else str(result)

    def close(self) -> None:
        with self._lock:
            self._session.close()


class ServerBackend:
    def __init__(self, url: str, user: str = "", password: str = "") -> None:
        import clickhouse_connect

        # A user and password given apart win over the URL's (a password from a secret needs no escaping).
        if user:
            self._client = clickhouse_connect.get_client(dsn=url, username=user, password=password)
        else:
            self._client = clickhouse_connect.get_client(dsn=url)

    def command(self, sql: str) -> None:
        self._client.command(sql)

    def insert_json(self, table: str, rows: list[dict[str, Any]]) -> None:
        body = "\n".join(json.dumps(r, default=str) for r in rows).encode()
        self._client.raw_insert(table, insert_block=body, fmt="JSONEachRow")

    def query(self, sql: str) -> list[dict[str, Any]]:
        return list(self._client.query(sql).named_results())

    def dump(self, sql: str) -> str:
        return bytes(self._client.raw_query(f"{sql} SETTINGS {_EXACT}", fmt="JSONEachRow")).decode()

    def close(self) -> None:
        self._client.close()
