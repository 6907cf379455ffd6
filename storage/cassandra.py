"""Conversations in Cassandra: chats and messages, written idempotently (the primary key is the event's id)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import astuple, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cassandra import ConsistencyLevel, InvalidRequest
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable, ResponseFuture, Session
from cassandra.policies import (
    ConstantSpeculativeExecutionPolicy,
    DCAwareRoundRobinPolicy,
    ExponentialReconnectionPolicy,
    RetryPolicy,
    TokenAwarePolicy,
)
from cassandra.query import PreparedStatement

from topics.settings import CassandraSettings

log = logging.getLogger(__name__)

SCHEMA = (
    # Ownership and metadata of one chat.
    """CREATE TABLE IF NOT EXISTS {ks}.chats (
         chat_id timeuuid PRIMARY KEY, user_id text, title text, created_at timestamp, last_run_id text,
         last_active_at timestamp, context_from timeuuid, memory_changed_at timestamp)""",
    # Where each run's reply stream lives, so any edge replica can replay or resume it; finish_reason is set
    # once the run has ended (cancel of a finished run is a conflict).
    """CREATE TABLE IF NOT EXISTS {ks}.runs (
         chat_id timeuuid, run_id timeuuid, reply_partition int, finish_reason text,
         PRIMARY KEY ((chat_id), run_id))""",
    # A user's chats, most recently active first. A chat's row moves when it is active again (delete + insert
    # in one batch); a row whose active_at no longer matches chats.last_active_at is stale and skipped.
    """CREATE TABLE IF NOT EXISTS {ks}.chats_by_activity (
         user_id text, active_at timestamp, chat_id timeuuid, title text, created_at timestamp,
         PRIMARY KEY ((user_id), active_at, chat_id)) WITH CLUSTERING ORDER BY (active_at DESC, chat_id DESC)""",
    # The turns of one chat in order. message_id is the event's id: a replay rewrites the same row.
    """CREATE TABLE IF NOT EXISTS {ks}.messages (
         chat_id timeuuid, message_id timeuuid, role text, content text, created_at timestamp,
         run_id text, model text, finish_reason text, pool text, feedback text,
         PRIMARY KEY ((chat_id), message_id)) WITH CLUSTERING ORDER BY (message_id ASC)""",
    # Moderation decisions that matched a rule (blocks, warnings, retractions), newest first per UTC day: the
    # admins' review list for false positives. decision_id is the event's id: a redelivery rewrites the row.
    """CREATE TABLE IF NOT EXISTS {ks}.safety_decisions (
         day text, at timestamp, decision_id uuid, stage text, action text, category text, score double,
         policy_version text, run_id text, chat_id text, user_id text, tier text, excerpt text,
         PRIMARY KEY ((day), at, decision_id)) WITH CLUSTERING ORDER BY (at DESC, decision_id DESC)""",
    # Conversation memory (docs/decisions/0008-conversation-memory.md): every stored message's MiniLM
    # embedding, searched per chat by approximate nearest neighbour (SAI vector index), and the chat's rolling
    # summaries, newest version first; `through` is the last message a summary covers.
    """CREATE TABLE IF NOT EXISTS {ks}.memory (
         chat_id timeuuid, message_id timeuuid, role text, content text, embedding vector<float, 384>,
         PRIMARY KEY ((chat_id), message_id))""",
    """CREATE CUSTOM INDEX IF NOT EXISTS memory_ann ON {ks}.memory (embedding) USING 'StorageAttachedIndex'
       WITH OPTIONS = {{'similarity_function': 'cosine'}}""",
    """CREATE TABLE IF NOT EXISTS {ks}.summaries (
         chat_id timeuuid, version int, through timeuuid, content text, tokens int, run_id text,
         created_at timestamp, PRIMARY KEY ((chat_id), version)) WITH CLUSTERING ORDER BY (version DESC)""",
    # API keys: only a SHA-256 of the key is stored (keys are 256-bit random, so a fast hash is enough).
    """CREATE TABLE IF NOT EXISTS {ks}.api_keys (
         key_hash text PRIMARY KEY, key_id timeuuid, user_id text, tier text, revoked boolean)""",
    """CREATE TABLE IF NOT EXISTS {ks}.api_keys_by_user (
         user_id text, key_id timeuuid, key_hash text, name text, prefix text, tier text, created_at timestamp,
         revoked_at timestamp, PRIMARY KEY ((user_id), key_id)) WITH CLUSTERING ORDER BY (key_id DESC)""",
)
# Columns added after a table first shipped: (table, column, type), applied when missing.
# context_from: a reset's marker (earlier messages stay listed but no longer go into prompts); memory_changed_at:
# when a message was last edited or deleted (a summary begun before it is discarded); pool: the model pool that
# wrote an answer; feedback: the user's rating of it (up | down).
COLUMNS_ADDED = (
    ("chats", "last_active_at", "timestamp"),
    ("runs", "finish_reason", "text"),
    ("chats", "context_from", "timeuuid"),
    ("chats", "memory_changed_at", "timestamp"),
    ("messages", "pool", "text"),
    ("messages", "feedback", "text"),
)


RECONNECT_MAX_S = 5.0
SPECULATE_AFTER_S = 1.0  # a statement's answer takes milliseconds; a second is a node that died or stalls
MIN_ID = uuid.UUID(int=0x00000000_0000_1000_8000_000000000000)  # the smallest timeuuid


def new_id() -> uuid.UUID:
    """A time-ordered id (version 1 with a random node, so no MAC address leaks)."""
    return uuid.uuid1(node=uuid.getnode() ^ int.from_bytes(uuid.uuid4().bytes[:6], "big") | 0x010000000000)


UUID_EPOCH = 0x01B21DD213814000  # 1582-10-15 -> 1970-01-01 in the 100 ns units of a version-1 uuid


def id_time_ms(value: uuid.UUID) -> int:
    """When a time-ordered id was minted (epoch ms), in exact integer arithmetic (the driver's
    unix_time_from_uuid1 goes through a float)."""
    return (value.time - UUID_EPOCH) // 10_000


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


async def wait(future: ResponseFuture) -> Any:
    """Bridge the driver's callback future into asyncio."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(rows: Any = None, exc: BaseException | None = None) -> None:
        if done.done():
            return
        if exc is None:
            done.set_result(rows)
        else:
            done.set_exception(exc)

    def ok(rows: Any) -> None:
        loop.call_soon_threadsafe(settle, rows)

    def fail(exc: BaseException) -> None:
        loop.call_soon_threadsafe(settle, None, exc)

    future.add_callbacks(ok, fail)
    await done
    # add_callbacks gives only the first page; the future itself knows the rest.
    return future.result()


@dataclass
class Message:
    id: str
    role: str
    content: str
    created_at: datetime
    run_id: str | None = None
    model: str | None = None
    finish_reason: str | None = None
    pool: str | None = None
    feedback: str | None = None  # the user's rating of an answer; never written by put_message


@dataclass
class ApiKey:
    key_id: str
    name: str
    prefix: str
    tier: str
    created_at: datetime
    revoked_at: datetime | None


@dataclass(frozen=True)
class SafetyDecision:
    decision_id: uuid.UUID
    at: datetime
    stage: str  # input | output
    action: str  # block | warn | log
    category: str
    score: float | None
    policy_version: str
    run_id: str
    chat_id: str
    user_id: str
    tier: str
    excerpt: str  # the start of the text decided on, for review


class Conversations:
    """Reads and writes of chats, runs, messages and API keys; one per process, built at start-up."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self.session = session
        self.ks = keyspace
        ks = keyspace
        p = idempotent(session)
        self._insert_chat: PreparedStatement = p(
            f"INSERT INTO {ks}.chats (chat_id, user_id, title, created_at, last_active_at) VALUES (?, ?, ?, ?, ?)"
        )
        self._insert_activity = p(
            f"INSERT INTO {ks}.chats_by_activity (user_id, active_at, chat_id, title, created_at) "
            "VALUES (?, ?, ?, ?, ?)"
        )
        self._delete_activity = p(
            f"DELETE FROM {ks}.chats_by_activity WHERE user_id = ? AND active_at = ? AND chat_id = ?"
        )
        self._get_chat = p(
            f"SELECT chat_id, user_id, title, created_at, last_run_id, last_active_at, context_from, memory_changed_at "
            f"FROM {ks}.chats WHERE chat_id = ?"
        )
        self._set_context_from = p(f"UPDATE {ks}.chats SET context_from = ?, memory_changed_at = ? WHERE chat_id = ?")
        self._set_memory_changed = p(f"UPDATE {ks}.chats SET memory_changed_at = ? WHERE chat_id = ?")
        self._get_chats = p(f"SELECT chat_id, title, last_active_at FROM {ks}.chats WHERE chat_id IN ?")
        self._set_active = p(f"UPDATE {ks}.chats SET last_active_at = ?, last_run_id = ? WHERE chat_id = ?")
        self._set_title = p(f"UPDATE {ks}.chats SET title = ? WHERE chat_id = ?")
        self._delete_chat = p(f"DELETE FROM {ks}.chats WHERE chat_id = ?")
        self._delete_messages = p(f"DELETE FROM {ks}.messages WHERE chat_id = ?")
        self._delete_runs = p(f"DELETE FROM {ks}.runs WHERE chat_id = ?")
        self._delete_memory = p(f"DELETE FROM {ks}.memory WHERE chat_id = ?")
        self._delete_summaries = p(f"DELETE FROM {ks}.summaries WHERE chat_id = ?")
        self._insert_run = p(f"INSERT INTO {ks}.runs (chat_id, run_id, reply_partition) VALUES (?, ?, ?)")
        self._get_run = p(f"SELECT reply_partition, finish_reason FROM {ks}.runs WHERE chat_id = ? AND run_id = ?")
        self._finish_run = p(f"UPDATE {ks}.runs SET finish_reason = ? WHERE chat_id = ? AND run_id = ?")
        self._list_chats = p(
            f"SELECT active_at, chat_id, title, created_at FROM {ks}.chats_by_activity WHERE user_id = ? LIMIT ?"
        )
        self._list_chats_after = p(
            f"SELECT active_at, chat_id, title, created_at FROM {ks}.chats_by_activity "
            "WHERE user_id = ? AND (active_at, chat_id) < (?, ?) LIMIT ?"
        )
        self._insert_message = p(
            f"INSERT INTO {ks}.messages (chat_id, message_id, role, content, created_at, run_id, model, "
            "finish_reason, pool) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        columns = "message_id, role, content, created_at, run_id, model, finish_reason, pool, feedback"
        self._list_messages = p(f"SELECT {columns} FROM {ks}.messages WHERE chat_id = ? AND message_id > ? LIMIT ?")
        self._messages_after = p(
            f"SELECT {columns} FROM {ks}.messages WHERE chat_id = ? AND message_id > ? ORDER BY message_id DESC LIMIT ?"
        )
        self._get_message = p(f"SELECT message_id FROM {ks}.messages WHERE chat_id = ? AND message_id = ?")
        self._one_message = p(f"SELECT {columns} FROM {ks}.messages WHERE chat_id = ? AND message_id = ?")
        self._set_feedback = p(f"UPDATE {ks}.messages SET feedback = ? WHERE chat_id = ? AND message_id = ?")
        self._set_content = p(f"UPDATE {ks}.messages SET content = ? WHERE chat_id = ? AND message_id = ?")
        self._delete_message = p(f"DELETE FROM {ks}.messages WHERE chat_id = ? AND message_id = ?")
        self._insert_key = p(
            f"INSERT INTO {ks}.api_keys (key_hash, key_id, user_id, tier, revoked) VALUES (?, ?, ?, ?, false)"
        )
        self._insert_key_by_user = p(
            f"INSERT INTO {ks}.api_keys_by_user (user_id, key_id, key_hash, name, prefix, tier, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)"
        )
        self._insert_decision = p(
            f"INSERT INTO {ks}.safety_decisions (day, decision_id, at, stage, action, category, score, "
            "policy_version, run_id, chat_id, user_id, tier, excerpt) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self._list_decisions = p(
            f"SELECT decision_id, at, stage, action, category, score, policy_version, run_id, chat_id, user_id, "
            f"tier, excerpt FROM {ks}.safety_decisions WHERE day = ? LIMIT ?"
        )
        self._get_key = p(f"SELECT user_id, tier, revoked FROM {ks}.api_keys WHERE key_hash = ?")
        self._user_keys = p(
            f"SELECT key_id, key_hash, name, prefix, tier, created_at, revoked_at FROM {ks}.api_keys_by_user "
            "WHERE user_id = ?"
        )
        self._revoke_key = p(f"UPDATE {ks}.api_keys SET revoked = true WHERE key_hash = ?")
        self._revoke_key_by_user = p(
            f"UPDATE {ks}.api_keys_by_user SET revoked_at = ? WHERE user_id = ? AND key_id = ?"
        )

    @classmethod
    def connect(cls, settings: CassandraSettings) -> Conversations:
        """Connect to the keyspace the migration made (storage/schema.py): processes run no DDL at start-up."""
        session = connect_session(settings)
        try:
            require_schema(session, settings.keyspace)
        except RuntimeError:
            session.cluster.shutdown()
            raise
        return cls(session, settings.keyspace)

    @staticmethod
    def create_schema(session: Session, settings: CassandraSettings) -> None:
        """The keyspace (with its replication) and every table: the migration's work, run from one client."""
        ensure_keyspace(session, settings)
        for statement in SCHEMA:
            session.execute(statement.format(ks=settings.keyspace), timeout=60)
        add_columns(session, settings.keyspace, COLUMNS_ADDED)

    def close(self) -> None:
        self.session.cluster.shutdown()

    async def _run(self, statement: Any, params: tuple[Any, ...]) -> Any:
        return await wait(self.session.execute_async(statement, params))

    async def _all(self, *items: tuple[Any, tuple[Any, ...]]) -> None:
        """Independent single-partition writes at once. Writes that touch several tables are not logged
        batches: until a killed node is convicted (about 20 s), a coordinator still picks it as a batchlog
        replica and every logged batch times out, while a plain LOCAL_QUORUM write needs only the two live
        copies. Each method orders or pairs its writes so that a failure between them leaves nothing a
        reader shows wrongly (docs/decisions/0011-replicated-data-plane.md), and a retry completes them."""
        await asyncio.gather(*(self._run(statement, params) for statement, params in items))

    # -- chats -------------------------------------------------------------------------------------
    async def create_chat(self, user_id: str, title: str) -> tuple[uuid.UUID, datetime]:
        chat_id = new_id()
        now = _now()
        # Either alone is invisible: a chat is listed only through both, and nobody has its id before the 201.
        await self._all(
            (self._insert_chat, (chat_id, user_id, title, now, now)),
            (self._insert_activity, (user_id, now, chat_id, title, now)),
        )
        return chat_id, now

    async def get_chat(self, chat_id: uuid.UUID) -> Any:
        return (await self._run(self._get_chat, (chat_id,))).one()

    async def rename_chat(self, chat: Any, title: str) -> None:
        active = _active_at(chat)
        await self._all(  # the list shows the chat row's title; the activity row's is a copy
            (self._set_title, (title, chat.chat_id)),
            (self._insert_activity, (chat.user_id, active, chat.chat_id, title, chat.created_at)),
        )

    async def delete_chat(self, chat: Any) -> None:
        """The chat, its messages, its runs (so its streams can no longer be resumed) and its memory. Its content
        goes first and the chat itself last: a delete cut short leaves the chat listed, and deleting it again
        finishes the job (nothing of it is left behind unowned)."""
        await self._all(
            (self._delete_messages, (chat.chat_id,)),
            (self._delete_runs, (chat.chat_id,)),
            (self._delete_memory, (chat.chat_id,)),
            (self._delete_summaries, (chat.chat_id,)),
        )
        await self._run(self._delete_activity, (chat.user_id, _active_at(chat), chat.chat_id))
        await self._run(self._delete_chat, (chat.chat_id,))

    async def list_chats(self, user_id: str, limit: int, after: tuple[datetime, uuid.UUID] | None) -> list[Any]:
        """A page of the user's chats, most recently active first; stale activity rows are skipped."""
        found: list[Any] = []
        while len(found) < limit:
            if after is None:
                rows = list(await self._run(self._list_chats, (user_id, limit)))
            else:
                rows = list(await self._run(self._list_chats_after, (user_id, after[0], after[1], limit)))
            if not rows:
                break
            current = {r.chat_id: r for r in await self._run(self._get_chats, ([r.chat_id for r in rows],))}
            for row in rows:
                chat = current.get(row.chat_id)
                if chat is not None and chat.last_active_at == row.active_at:
                    found.append(row._replace(title=chat.title))
            if len(rows) < limit:
                break
            after = (rows[-1].active_at, rows[-1].chat_id)
        return found[:limit]

    # -- runs --------------------------------------------------------------------------------------
    async def open_run(self, chat: Any, run_id: uuid.UUID, reply_partition: int) -> datetime:
        """Record a new run of the chat (where its stream lives), make it the chat's latest and the chat active;
        returns when (the chat's new last activity)."""
        now = _now()
        # In this order, a failure between two writes leaves the chat listed once, at its old or its new place:
        # an activity row counts only while the chat row's last_active_at matches it.
        await self._all(
            (self._insert_run, (chat.chat_id, run_id, reply_partition)),
            (self._insert_activity, (chat.user_id, now, chat.chat_id, chat.title, chat.created_at)),
        )
        await self._run(self._set_active, (now, str(run_id), chat.chat_id))
        await self._run(self._delete_activity, (chat.user_id, _active_at(chat), chat.chat_id))
        return now

    async def withdraw_run(self, chat: Any, run_id: uuid.UUID, opened_at: datetime) -> None:
        """A run opened whose prompt never reached the log: ended (`not_accepted`), and the chat's latest run the
        one before it again (the chat keeps its new place in the list)."""
        await self._run(self._finish_run, ("not_accepted", chat.chat_id, run_id))
        await self._run(self._set_active, (opened_at, chat.last_run_id, chat.chat_id))

    async def get_run(self, chat_id: uuid.UUID, run_id: uuid.UUID) -> tuple[int, str | None] | None:
        """(reply partition, finish reason or None while it runs), or None when the chat has no such run."""
        row = (await self._run(self._get_run, (chat_id, run_id))).one()
        return (int(row.reply_partition), row.finish_reason) if row else None

    async def finish_run(self, chat_id: uuid.UUID, run_id: uuid.UUID, finish_reason: str) -> None:
        await self._run(self._finish_run, (finish_reason, chat_id, run_id))

    # -- safety decisions ------------------------------------------------------------------------
    async def put_decision(self, d: SafetyDecision) -> None:
        await self._run(self._insert_decision, (_day(d.at), *astuple(d)))  # columns in the dataclass's order

    async def recent_decisions(self, limit: int, days: int = 7) -> list[SafetyDecision]:
        """The newest decisions, today first, looking back at most `days` UTC days."""
        found: list[SafetyDecision] = []
        now = datetime.now(UTC)
        for back in range(days):
            if len(found) >= limit:
                break
            rows = await self._run(self._list_decisions, (_day(now - timedelta(days=back)), limit - len(found)))
            found += [SafetyDecision(row.decision_id, utc(row.at), *row[2:]) for row in rows]
        return found

    # -- messages ----------------------------------------------------------------------------------
    async def list_messages(self, chat_id: uuid.UUID, limit: int, after: uuid.UUID | None) -> list[Message]:
        rows = await self._run(self._list_messages, (chat_id, after or MIN_ID, limit))
        return [_message(r) for r in rows]

    async def messages_after(self, chat_id: uuid.UUID, after: uuid.UUID | None, limit: int) -> list[Message]:
        """The newest `limit` messages later than `after` (all of the chat's when None), oldest first."""
        rows = await self._run(self._messages_after, (chat_id, after or MIN_ID, limit))
        return [_message(r) for r in reversed(list(rows))]

    async def get_message(self, chat_id: uuid.UUID, message_id: uuid.UUID) -> Message | None:
        row = (await self._run(self._one_message, (chat_id, message_id))).one()
        return _message(row) if row else None

    async def edit_message(self, chat_id: uuid.UUID, message_id: uuid.UUID, content: str) -> None:
        # The change is marked first: a summary begun before it is discarded even if the edit itself fails.
        await self._run(self._set_memory_changed, (_now(), chat_id))
        await self._run(self._set_content, (content, chat_id, message_id))

    async def delete_message(self, chat_id: uuid.UUID, message_id: uuid.UUID) -> None:
        await self._run(self._set_memory_changed, (_now(), chat_id))
        await self._run(self._delete_message, (chat_id, message_id))

    async def reset_context(self, chat_id: uuid.UUID) -> uuid.UUID:
        """Later prompts start from here: the chat's earlier messages stay listed but leave its memory."""
        marker = new_id()
        await self._run(self._set_context_from, (marker, _now(), chat_id))
        return marker

    async def has_message(self, chat_id: uuid.UUID, message_id: uuid.UUID) -> bool:
        return (await self._run(self._get_message, (chat_id, message_id))).one() is not None

    async def put_message(self, chat_id: uuid.UUID, message: Message) -> None:
        """Idempotent: the message id comes from the event, so a redelivered event rewrites the same row."""
        await self._run(
            self._insert_message,
            (
                chat_id,
                uuid.UUID(message.id),
                message.role,
                message.content,
                message.created_at,
                message.run_id,
                message.model,
                message.finish_reason,
                message.pool,
            ),
        )

    async def set_feedback(self, chat_id: uuid.UUID, message_id: uuid.UUID, rating: str | None) -> bool:
        """Record the user's rating of a stored message (None clears it); False when there is no such message
        (an update would create a row holding only the rating)."""
        if not await self.has_message(chat_id, message_id):
            return False
        await self._run(self._set_feedback, (rating, chat_id, message_id))
        return True

    # -- API keys ----------------------------------------------------------------------------------
    async def create_key(self, user_id: str, tier: str, name: str, key_hash: str, prefix: str) -> ApiKey:
        key_id, now = new_id(), _now()
        await self._run(self._insert_key, (key_hash, key_id, user_id, tier))
        await self._run(self._insert_key_by_user, (user_id, key_id, key_hash, name, prefix, tier, now))
        return ApiKey(str(key_id), name, prefix, tier, now, None)

    async def key_owner(self, key_hash: str) -> tuple[str, str] | None:
        """(user id, tier) of a live key, None when unknown or revoked."""
        row = (await self._run(self._get_key, (key_hash,))).one()
        return None if row is None or row.revoked else (row.user_id, row.tier)

    async def list_keys(self, user_id: str) -> list[ApiKey]:
        return [_key(r) for r in await self._run(self._user_keys, (user_id,))]

    async def revoke_key(self, user_id: str, key_id: uuid.UUID) -> bool:
        rows = [r for r in await self._run(self._user_keys, (user_id,)) if r.key_id == key_id]
        if not rows:
            return False
        await self._run(self._revoke_key, (rows[0].key_hash,))
        if rows[0].revoked_at is None:
            await self._run(self._revoke_key_by_user, (_now(), user_id, key_id))
        return True


def _now() -> datetime:
    """Millisecond precision: Cassandra timestamps hold milliseconds, and activity rows are matched on equality."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def _active_at(chat: Any) -> datetime:
    active: datetime = chat.last_active_at or chat.created_at
    return active


def _key(row: Any) -> ApiKey:
    revoked = utc(row.revoked_at) if row.revoked_at else None
    return ApiKey(str(row.key_id), row.name, row.prefix, row.tier, utc(row.created_at), revoked)


def replication(settings: CassandraSettings) -> dict[str, str]:
    """The keyspace's replication map: a copy count per datacenter (NetworkTopologyStrategy)."""
    return {"class": "org.apache.cassandra.locator.NetworkTopologyStrategy"} | {
        dc: str(copies) for dc, copies in sorted(settings.replication.items())
    }


def require_schema(session: Session, keyspace: str) -> None:
    """Fail at start-up, saying what to run, when the migration has not made the keyspace and its tables."""
    tables = {t.removeprefix("{ks}.") for t in re.findall(r"TABLE IF NOT EXISTS (\S+) \(", " ".join(SCHEMA))}
    meta = session.cluster.metadata.keyspaces.get(keyspace)
    missing = sorted(tables - set(meta.tables)) if meta else sorted(tables)
    if missing:
        raise RuntimeError(
            f"keyspace {keyspace!r} lacks {', '.join(missing)}: run the migration first "
            "(`python -m storage.schema`, the chart's migration Job, or `parley up`)"
        )


def ensure_keyspace(session: Session, settings: CassandraSettings) -> None:
    """Create the keyspace with the configured replication, or change an existing keyspace's replication to it
    (Cassandra then needs `nodetool repair` on each node to copy existing rows to their new replicas)."""
    wanted = replication(settings)
    literal = ", ".join(f"'{k}': '{v}'" for k, v in wanted.items())
    session.execute(f"CREATE KEYSPACE IF NOT EXISTS {settings.keyspace} WITH replication = {{{literal}}}", timeout=60)
    row = session.execute(
        "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = %s", (settings.keyspace,), timeout=60
    ).one()
    if row is not None and dict(row.replication) != wanted:
        log.warning("keyspace %s: replication %s -> %s; run a repair", settings.keyspace, row.replication, wanted)
        session.execute(f"ALTER KEYSPACE {settings.keyspace} WITH replication = {{{literal}}}", timeout=60)


class FailoverRetry(RetryPolicy):  # type: ignore[misc]
    """The driver's retries, except that a coordinator that counts too few live replicas (it has not yet seen a
    node come back) is left for the next host twice, not once."""

    def on_unavailable(self, query: Any, consistency: int, *args: Any, **kwargs: Any) -> Any:
        retry_num = kwargs.get("retry_num", args[-1] if args else 0)
        return (self.RETRY_NEXT_HOST, consistency) if retry_num < 2 else (self.RETHROW, None)


def idempotent(session: Session) -> Callable[[str], PreparedStatement]:
    """`session.prepare` for statements that may run twice with the same effect (every write here sets the
    values it is given, keyed by ids from the event or the request; none is a counter or a compare-and-set).
    The driver sends such a statement again to another replica when the first does not answer (speculative
    execution, `connect_session`), and only such: without it a request caught on the connection of a node that had
    just been killed waited out the 10 s request timeout and failed (the cluster bench's POST /v1/chats)."""

    def prepare(query: str) -> PreparedStatement:
        statement: PreparedStatement = session.prepare(query)
        statement.is_idempotent = True
        return statement

    return prepare


def connect_session(settings: CassandraSettings, timeout_s: float = 90.0) -> Session:
    """Connect, retrying while a node that has just started (or is swamped by every stage connecting at once
    on a small machine) does not answer yet. A failed connect shuts its Cluster down, so each try builds one.
    Every statement runs at the configured consistency (LOCAL_QUORUM: a write is acknowledged by a majority of
    the local datacenter's copies, so it survives losing one), compare-and-set at LOCAL_SERIAL. An idempotent
    statement with no answer after SPECULATE_AFTER_S is sent once more, to the next replica in its plan."""
    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=settings.datacenter)),
        consistency_level=ConsistencyLevel.name_to_value[settings.consistency],
        serial_consistency_level=ConsistencyLevel.name_to_value[settings.serial_consistency],
        retry_policy=FailoverRetry(),
        request_timeout=10,
        speculative_execution_policy=ConstantSpeculativeExecutionPolicy(SPECULATE_AFTER_S, max_attempts=1),
    )
    deadline = time.monotonic() + timeout_s
    while True:
        cluster = Cluster(
            list(settings.hosts),
            port=settings.port,
            connect_timeout=10,
            protocol_version=5,
            execution_profiles={EXEC_PROFILE_DEFAULT: profile},
            # A node that comes back is used again within seconds (the driver's default backs off to 600 s).
            reconnection_policy=ExponentialReconnectionPolicy(base_delay=0.5, max_delay=RECONNECT_MAX_S),
            auth_provider=PlainTextAuthProvider(settings.username, settings.password) if settings.username else None,
        )
        try:
            return cluster.connect()
        except NoHostAvailable as exc:
            cluster.shutdown()
            if time.monotonic() > deadline:
                raise
            log.info("Cassandra not reachable yet (%s); retrying", exc)
            time.sleep(1.0)


def agree(session: Session, timeout_s: float = 60.0) -> None:
    """Wait until every node has the same schema: a table one node has just created is not yet known to the
    others, and a statement prepared there fails "table ... does not exist" (seen on the 3-node cluster)."""
    if not session.cluster.control_connection.wait_for_schema_agreement(wait_time=timeout_s):
        raise RuntimeError(f"Cassandra nodes did not agree on the schema within {timeout_s:.0f}s")


def add_columns(session: Session, keyspace: str, columns: tuple[tuple[str, str, str], ...]) -> None:
    """Add each (table, column, type) a table created by an older release lacks (schema evolution)."""
    # The columns are read with an ordinary query rather than the driver's schema metadata: its refresh
    # runs on the control connection with a short timeout, and failed outright on a node that had just
    # restarted with every stage connecting at once (CI, test_restart).
    for table, column, kind in columns:
        present = session.execute(
            "SELECT column_name FROM system_schema.columns WHERE keyspace_name = %s AND table_name = %s "
            "AND column_name = %s",
            (keyspace, table, column),
            timeout=60,
        ).one()
        if present is None:
            try:
                session.execute(f"ALTER TABLE {keyspace}.{table} ADD {column} {kind}", timeout=60)
            except InvalidRequest as exc:  # another stage starting beside this one added it first
                if "exist" not in str(exc).lower():  # "already exists", "conflicts with an existing column"
                    raise
        _usable(session, keyspace, table, column)


def _usable(session: Session, keyspace: str, table: str, column: str, timeout_s: float = 30.0) -> None:
    """Wait until a column just added can be queried: while another stage's ALTER is still being applied, the
    schema tables already list it but a statement naming it fails "Undefined column name"."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            session.execute(f"SELECT {column} FROM {keyspace}.{table} LIMIT 1", timeout=60)
            return
        except InvalidRequest:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def utc(value: datetime) -> datetime:
    """The driver returns naive datetimes that are UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _message(row: Any) -> Message:
    return Message(
        str(row.message_id),
        row.role,
        row.content,
        utc(row.created_at),
        row.run_id,
        row.model,
        row.finish_reason,
        row.pool,
        row.feedback,
    )


def _day(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d")
