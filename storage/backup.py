"""What a backup keeps of each table, and each row sealed for it with its owner's key and opened from it
(`parley backup` / `parley restore`, infra/backup_commands.py; docs/backup.md).

A backup is logical: every kept row as JSON (Cassandra's `SELECT JSON`, ClickHouse's JSONEachRow), so it
restores onto a fresh cluster of any size and any newer schema. The columns that hold a person's text (and the
embeddings made from it) are sealed with that person's data key (topics/sealed.py) as the row is written out,
and the backup holds no keys: a person erased after the backup has no key left, so their rows in it never open
again, and a restore drops them.

Not kept, on purpose: sign-ins under way and failed ones, browser sessions (they hold refresh tokens; people
sign in again), idempotency keys (a day's dedupe), run fates (a week's fence) and the retention lease; the
ClickHouse rollups, which the restored usage rows rebuild through their views.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent_with_args

from runtime.settings import Periods
from topics.sealed import ERASED, Keys, is_sealed, open_text, seal_text

FORMAT = "parley-backup/1"
MANIFEST = "manifest.json"


class Digest:
    """A file written as gzipped JSON lines, counted and digested as it goes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = gzip.open(path, "wt", encoding="utf-8", compresslevel=3)
        self.rows = 0

    def write(self, row: dict[str, Any]) -> None:
        self._file.write(json.dumps(row, separators=(",", ":")) + "\n")
        self.rows += 1

    def close(self) -> dict[str, Any]:
        self._file.close()
        return {"rows": self.rows, "bytes": self.path.stat().st_size, "sha256": sha256(self.path)}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def lines(path: Path) -> Iterator[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


@dataclass(frozen=True)
class Kept:
    """A kept table: the column naming its rows' owner, what that column holds (a user id, or a chat's or a
    document's id whose owner the backup looks up), and the owner's columns to seal. `expires`: the period
    (runtime/settings.py Periods) a row lives from its `since` column, so a restored row keeps only what was
    left of it."""

    owner: str = ""
    personal: tuple[str, ...] = ()
    by: str = "user"  # user | chat | document
    expires: str = ""
    since: str = ""


_TEXT = ("content",)
_VECTOR = ("content", "embedding")

CASSANDRA: dict[str, Kept | None] = {
    "chats": Kept("user_id", ("title",)),
    "chats_by_activity": Kept("user_id", ("title",)),
    "runs": Kept("chat_id", by="chat"),
    # an answer's memories, passages (JSON) and tool calls and results (JSON), a rating's comment (JSON)
    "messages": Kept("chat_id", ("content", "feedback", "memories", "sources", "tools"), by="chat"),
    "message_changes": Kept("chat_id", _TEXT, by="chat"),
    "memory": Kept("chat_id", _VECTOR, by="chat"),
    "summaries": Kept("chat_id", _TEXT, by="chat"),
    "chat_settings": Kept("chat_id", ("instructions",), by="chat"),
    "documents": Kept("user_id", ("name",)),
    "document_blobs": Kept("document_id", ("data",), by="document"),
    "document_status": Kept("chat_id", by="chat"),
    "document_passages": Kept("chat_id", ("content", "embedding", "place"), by="chat"),
    "memories": Kept("user_id", _VECTOR),
    "person_settings": Kept("user_id", ("instructions",)),
    "chat_marks": Kept("user_id"),
    "shares": Kept("owner", ("title", "messages")),
    "shares_by_owner": Kept("owner", ("title",)),
    "people": Kept("user_id", ("name", "email")),
    "local_accounts": Kept("username", ("password_hash",)),
    "install_owner": Kept("user_id"),
    "api_keys": Kept("user_id"),
    "api_keys_by_user": Kept("user_id", ("name",)),
    "budgets": Kept("user_id"),
    "safety_decisions": Kept("user_id", ("excerpt",), expires="safety", since="at"),
    "responses": Kept("user_id", ("messages", "request"), expires="responses", since="created_at"),
    "responses_by_user": Kept("user_id"),
    "run_fates": None,
    "idempotency_keys": None,
    "web_sessions": None,
    "signins_pending": None,
    "signin_failures": None,
    "retention_lease": None,
}

CLICKHOUSE: dict[str, Kept] = {
    "usage": Kept("user_id"),
    "chat_search": Kept("user_id", _VECTOR),
    "chat_search_removed": Kept("user_id"),
    "erased_people": Kept(),
    "audit_log": Kept(),
    "eval_results": Kept(),
}


class Owners:
    """Whose each chat and document is, read from the chats and documents tables before anything else."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self.chats = {
            str(r.chat_id): r.user_id
            for r in session.execute(f"SELECT chat_id, user_id FROM {keyspace}.chats")
        }
        self.documents = {
            str(r.document_id): r.user_id
            for r in session.execute(f"SELECT document_id, user_id FROM {keyspace}.documents")
        }

    def of(self, kept: Kept, row: dict[str, Any]) -> str:
        value = row.get(kept.owner)
        if value is None or not kept.owner:
            return ""
        if kept.by == "chat":
            return str(self.chats.get(str(value), ""))
        if kept.by == "document":
            return str(self.documents.get(str(value), ""))
        return str(value)


KEY = "_key"  # a row's owner's key id, beside its columns (no CQL or ClickHouse column is named so)


def seal_row(kept: Kept, row: dict[str, Any], owner: str, keys: Keys) -> dict[str, Any] | None:
    """The row with its owner's key id beside it and their columns sealed (each value as JSON, so a blob, a
    vector or a string alike); None for a row of nobody's (a deleted chat's leftovers) or of someone erased."""
    if not kept.owner:
        return row
    texts = {c: row[c] for c in kept.personal if row.get(c) is not None}
    if not owner:
        return row if kept.by == "user" and not texts else None
    found = keys.sealing(owner)
    if found is None:
        return None
    key_id, cipher = found
    sealed = {c: seal_text(key_id, cipher, json.dumps(v)) for c, v in texts.items()}
    return {**row, **sealed, KEY: key_id}


def open_row(kept: Kept, row: dict[str, Any], keys: Keys) -> dict[str, Any] | None:
    """The row as it was; None when its owner has been erased since (their key is gone): every row of theirs,
    with text or without, stays out of the restored stores."""
    key_id = row.pop(KEY, None)
    if key_id is not None and keys.opening(str(key_id)) is None:
        return None
    opened = dict(row)
    for column in kept.personal:
        value = row.get(column)
        if isinstance(value, str) and is_sealed(value):
            text = open_text(value, keys)
            if text == ERASED:
                return None
            opened[column] = json.loads(text)
    return opened


def usage_row(row: dict[str, Any], keys: Keys, pseudonyms: dict[str, str]) -> dict[str, Any]:
    """A usage row as restored: a billing record stays, under a pseudonym when its person has been erased since
    (storage/usage_erasure.py; `pseudonyms` collects {user id: pseudonym} for erased_people). Every restored
    row is an original (`copied` 0): the rows it was copied from are not in the backup, so the hourly rollup's
    view counts it once."""
    key_id = row.pop(KEY, None)
    row["copied"] = 0
    if key_id is not None and keys.opening(str(key_id)) is None:
        user_id = str(row["user_id"])
        row["user_id"] = pseudonyms.setdefault(user_id, f"erased-{uuid.uuid4().hex[:16]}")
    return row


def cassandra_rows(session: Session, keyspace: str, table: str) -> Iterator[dict[str, Any]]:
    """Every row of a table, paged, as Cassandra writes it in JSON (blobs as 0x hex, times as text)."""
    for (text,) in session.execute(f"SELECT JSON * FROM {keyspace}.{table}"):
        yield json.loads(text)


def left_s(kept: Kept, row: dict[str, Any], periods: Periods, now_s: float) -> int | None:
    """Seconds a restored row has left of its period: None when it does not expire, 0 when it is past it."""
    seconds = periods.seconds(kept.expires) if kept.expires else 0
    since = row.get(kept.since)
    if not seconds or not since:
        return None
    # Cassandra's JSON timestamp: '2026-12-06 06:06:54.468Z'
    written = (
        datetime.strptime(str(since)[:19], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
    )
    return max(0, int(written + seconds - now_s))


class Inserts:
    """Rows written back into a table, as many at once as the cluster takes, each column through fromJson so
    every type comes back as it was written out; a null column is left unset (a row of a partition's static
    columns alone stays one)."""

    def __init__(self, session: Session, keyspace: str, table: str) -> None:
        self._session = session
        self._table = f"{keyspace}.{table}"
        self._statements: dict[tuple[tuple[str, ...], bool], Any] = {}
        self._pending: dict[tuple[tuple[str, ...], bool], list[list[Any]]] = {}
        self.written = 0

    def add(self, row: dict[str, Any], ttl: int | None = None) -> None:
        columns = tuple(c for c, v in row.items() if v is not None)
        shape = (columns, ttl is not None)
        args: list[Any] = [json.dumps(row[c]) for c in columns]
        if ttl is not None:
            args.append(ttl)
        self._pending.setdefault(shape, []).append(args)
        if len(self._pending[shape]) >= 500:
            self._flush(shape)

    def _flush(self, shape: tuple[tuple[str, ...], bool]) -> None:
        batch = self._pending.pop(shape, [])
        if not batch:
            return
        statement = self._statements.get(shape)
        if statement is None:
            columns, expires = shape
            statement = self._statements[shape] = self._session.prepare(
                f"INSERT INTO {self._table} ({', '.join(columns)}) "
                f"VALUES ({', '.join('fromJson(?)' for _ in columns)})"
                + (" USING TTL ?" if expires else "")
            )
        for ok, result in execute_concurrent_with_args(
            self._session, statement, batch, concurrency=64, raise_on_first_error=False
        ):
            if not ok:
                raise RuntimeError(f"{self._table}: a row was not written back: {result}")
        self.written += len(batch)

    def close(self) -> int:
        for shape in list(self._pending):
            self._flush(shape)
        return self.written
