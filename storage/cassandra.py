"""Conversations in Cassandra: chats and messages, written idempotently (the primary key is the event's id)."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cassandra.cluster import Cluster, ResponseFuture, Session
from cassandra.policies import DCAwareRoundRobinPolicy
from cassandra.query import PreparedStatement

SCHEMA = (
    """CREATE KEYSPACE IF NOT EXISTS {ks}
       WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}""",
    # Ownership and metadata of one chat.
    """CREATE TABLE IF NOT EXISTS {ks}.chats (
         chat_id timeuuid PRIMARY KEY, user_id text, title text, created_at timestamp, last_run_id text)""",
    # Where each run's reply stream lives, so any edge replica can replay or resume it.
    """CREATE TABLE IF NOT EXISTS {ks}.runs (
         chat_id timeuuid, run_id timeuuid, reply_partition int,
         PRIMARY KEY ((chat_id), run_id))""",
    # A user's chats, newest first (chat ids are time-ordered).
    """CREATE TABLE IF NOT EXISTS {ks}.chats_by_user (
         user_id text, chat_id timeuuid, title text, created_at timestamp,
         PRIMARY KEY ((user_id), chat_id)) WITH CLUSTERING ORDER BY (chat_id DESC)""",
    # The turns of one chat in order. message_id is the event's id: a replay rewrites the same row.
    """CREATE TABLE IF NOT EXISTS {ks}.messages (
         chat_id timeuuid, message_id timeuuid, role text, content text, created_at timestamp,
         run_id text, model text, finish_reason text,
         PRIMARY KEY ((chat_id), message_id)) WITH CLUSTERING ORDER BY (message_id ASC)""",
)


def new_id() -> uuid.UUID:
    """A time-ordered id (version 1 with a random node, so no MAC address leaks)."""
    return uuid.uuid1(node=uuid.getnode() ^ int.from_bytes(uuid.uuid4().bytes[:6], "big") | 0x010000000000)


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


class Conversations:
    """Reads and writes of chats and messages; one per process, built from settings at start-up."""

    def __init__(self, session: Session, keyspace: str) -> None:
        self.session = session
        self.ks = keyspace
        p = session.prepare
        self._insert_chat: PreparedStatement = p(
            f"INSERT INTO {keyspace}.chats (chat_id, user_id, title, created_at) VALUES (?, ?, ?, ?)"
        )
        self._insert_chat_by_user = p(
            f"INSERT INTO {keyspace}.chats_by_user (user_id, chat_id, title, created_at) VALUES (?, ?, ?, ?)"
        )
        self._get_chat = p(f"SELECT user_id, title, created_at, last_run_id FROM {keyspace}.chats WHERE chat_id = ?")
        self._set_last_run = p(f"UPDATE {keyspace}.chats SET last_run_id = ? WHERE chat_id = ?")
        self._insert_run = p(f"INSERT INTO {keyspace}.runs (chat_id, run_id, reply_partition) VALUES (?, ?, ?)")
        self._get_run = p(f"SELECT reply_partition FROM {keyspace}.runs WHERE chat_id = ? AND run_id = ?")
        self._list_chats = p(
            f"SELECT chat_id, title, created_at FROM {keyspace}.chats_by_user WHERE user_id = ? LIMIT ?"
        )
        self._list_chats_after = p(
            f"SELECT chat_id, title, created_at FROM {keyspace}.chats_by_user WHERE user_id = ? AND chat_id < ? LIMIT ?"
        )
        self._insert_message = p(
            f"INSERT INTO {keyspace}.messages (chat_id, message_id, role, content, created_at, run_id, model, "
            "finish_reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self._list_messages = p(
            f"SELECT message_id, role, content, created_at, run_id, model, finish_reason FROM {keyspace}.messages "
            "WHERE chat_id = ? AND message_id > ? LIMIT ?"
        )
        self._recent_messages = p(
            f"SELECT message_id, role, content, created_at, run_id, model, finish_reason FROM {keyspace}.messages "
            "WHERE chat_id = ? ORDER BY message_id DESC LIMIT ?"
        )
        self._get_message = p(f"SELECT message_id FROM {keyspace}.messages WHERE chat_id = ? AND message_id = ?")

    @classmethod
    def connect(cls, hosts: str, port: int, keyspace: str) -> Conversations:
        cluster = Cluster(
            hosts.split(","),
            port=port,
            connect_timeout=10,
            protocol_version=5,
            load_balancing_policy=DCAwareRoundRobinPolicy(local_dc="datacenter1"),
        )
        session = cluster.connect()
        for statement in SCHEMA:
            session.execute(statement.format(ks=keyspace), timeout=60)
        return cls(session, keyspace)

    def close(self) -> None:
        self.session.cluster.shutdown()

    async def create_chat(self, user_id: str, title: str) -> tuple[uuid.UUID, datetime]:
        chat_id = new_id()
        now = datetime.now(UTC)
        await wait(self.session.execute_async(self._insert_chat, (chat_id, user_id, title, now)))
        await wait(self.session.execute_async(self._insert_chat_by_user, (user_id, chat_id, title, now)))
        return chat_id, now

    async def get_chat(self, chat_id: uuid.UUID) -> Any:
        rows = await wait(self.session.execute_async(self._get_chat, (chat_id,)))
        return rows.one()

    async def open_run(self, chat_id: uuid.UUID, run_id: uuid.UUID, reply_partition: int) -> None:
        """Record a new run of the chat: where its stream lives, and that it is now the chat's latest."""
        await wait(self.session.execute_async(self._insert_run, (chat_id, run_id, reply_partition)))
        await wait(self.session.execute_async(self._set_last_run, (str(run_id), chat_id)))

    async def run_partition(self, chat_id: uuid.UUID, run_id: uuid.UUID) -> int | None:
        row = (await wait(self.session.execute_async(self._get_run, (chat_id, run_id)))).one()
        return int(row.reply_partition) if row else None

    async def list_chats(self, user_id: str, limit: int, after: uuid.UUID | None) -> list[Any]:
        if after is None:
            rows = await wait(self.session.execute_async(self._list_chats, (user_id, limit)))
        else:
            rows = await wait(self.session.execute_async(self._list_chats_after, (user_id, after, limit)))
        return list(rows)

    async def list_messages(self, chat_id: uuid.UUID, limit: int, after: uuid.UUID | None) -> list[Message]:
        floor = after or uuid.UUID(int=0x00000000_0000_1000_8000_000000000000)  # the smallest timeuuid
        rows = await wait(self.session.execute_async(self._list_messages, (chat_id, floor, limit)))
        return [_message(r) for r in rows]

    async def recent_messages(self, chat_id: uuid.UUID, limit: int) -> list[Message]:
        rows = await wait(self.session.execute_async(self._recent_messages, (chat_id, limit)))
        return [_message(r) for r in reversed(list(rows))]

    async def has_message(self, chat_id: uuid.UUID, message_id: uuid.UUID) -> bool:
        rows = await wait(self.session.execute_async(self._get_message, (chat_id, message_id)))
        return rows.one() is not None

    async def put_message(self, chat_id: uuid.UUID, message: Message) -> None:
        """Idempotent: the message id comes from the event, so a redelivered event rewrites the same row."""
        await wait(
            self.session.execute_async(
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
                ),
            )
        )


def utc(value: datetime) -> datetime:
    """The driver returns naive datetimes that are UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _message(row: Any) -> Message:
    return Message(
        str(row.message_id), row.role, row.content, utc(row.created_at), row.run_id, row.model, row.finish_reason
    )
