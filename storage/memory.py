"""A chat's long-term memory in Cassandra: message embeddings searched by ANN, and rolling summaries.

Every stored message's MiniLM embedding, searched per chat by approximate nearest neighbour (SAI vector
index), and the chat's rolling summaries, newest version first; `through` is the last message a summary
covers. The store shares the process's session. Design: docs/decisions/0008-conversation-memory.md.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from cassandra.cluster import Session

from storage.at_rest import opened, seal
from storage.ids import utc
from storage.session import Store, create_tables

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS {ks}.memory (
         chat_id timeuuid, message_id timeuuid, role text, content text, embedding vector<float, 384>,
         PRIMARY KEY ((chat_id), message_id))""",
    """CREATE CUSTOM INDEX IF NOT EXISTS memory_ann ON {ks}.memory (embedding) USING 'StorageAttachedIndex'
       WITH OPTIONS = {{'similarity_function': 'cosine'}}""",
    """CREATE TABLE IF NOT EXISTS {ks}.summaries (
         chat_id timeuuid, version int, through timeuuid, content text, tokens int, run_id text,
         created_at timestamp, PRIMARY KEY ((chat_id), version)) WITH CLUSTERING ORDER BY (version DESC)""",
)


def create_schema(session: Session, keyspace: str) -> None:
    create_tables(session, keyspace, SCHEMA, ())


@dataclass(frozen=True)
class Recalled:
    id: str
    role: str
    content: str
    embedding: list[float]


@dataclass(frozen=True)
class Summary:
    version: int
    through: str  # the last message it covers
    content: str
    tokens: int
    run_id: str
    created_at: datetime | None = None


class Memory(Store):
    """Written by the memory stage alone: it embeds what the log records and applies a user's edits, deletes
    and resets as their events reach it; until then a reader lays the chat's changes over what it finds
    (conversation/gather.py).

    An embedding row is written and deleted at the time of the text it holds (`at_us`, Cassandra's write
    timestamp), not at the time the write happens: a message's first text at its id's time, an edit, delete
    or reset at the time the user made it. The stage handles completions and changes concurrently and may
    read a chat's changes just before the user makes one; whichever of two writes lands last, the user's
    newer text or delete wins (a delete wins a tie), so a late completion never brings back what the user
    edited, deleted or reset.

    The text beside each embedding and the summaries are sealed with the chat owner's key (storage/at_rest.py)."""

    WRITERS = {"memory": "memory", "summaries": "memory"}

    def __init__(self, session: Session, keyspace: str, writer: str) -> None:
        super().__init__(session, keyspace, writer)
        ks, p = keyspace, self._prepare
        self._put = p(
            f"INSERT INTO {ks}.memory (chat_id, message_id, role, content, embedding) VALUES (?, ?, ?, ?, ?) "
            "USING TIMESTAMP ?"
        )
        self._forget = p(
            f"DELETE FROM {ks}.memory USING TIMESTAMP ? WHERE chat_id = ? AND message_id = ?"
        )
        self._recall = p(
            f"SELECT message_id, role, content, embedding FROM {ks}.memory "
            "WHERE chat_id = ? AND message_id > ? AND message_id < ? ORDER BY embedding ANN OF ? LIMIT ?"
        )
        self._forget_all = p(f"DELETE FROM {ks}.memory USING TIMESTAMP ? WHERE chat_id = ?")
        self._summaries = p(
            f"SELECT version, through, content, tokens, run_id, created_at FROM {ks}.summaries "
            "WHERE chat_id = ? LIMIT ?"
        )
        self._put_summary = p(
            f"INSERT INTO {ks}.summaries (chat_id, version, through, content, tokens, run_id, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)"
        )
        self._drop_summary = p(f"DELETE FROM {ks}.summaries WHERE chat_id = ? AND version = ?")
        self._drop_summaries = p(f"DELETE FROM {ks}.summaries WHERE chat_id = ?")

    # -- embeddings --------------------------------------------------------------------------------
    async def remember(
        self,
        chat_id: uuid.UUID,
        message_id: uuid.UUID,
        role: str,
        content: str,
        embedding: list[float],
        at_us: int,
        owner: str,
    ) -> None:
        """Idempotent: keyed by the message's id, written at the time of its text."""
        sealed = seal(owner, content)
        await self._run(self._put, (chat_id, message_id, role, sealed, embedding, at_us))

    async def forget(self, chat_id: uuid.UUID, message_id: uuid.UUID, at_us: int) -> None:
        """The message's embedding, and any text of it older than `at_us` written later."""
        await self._run(self._forget, (at_us, chat_id, message_id))

    async def recall(
        self,
        chat_id: uuid.UUID,
        embedding: list[float],
        k: int,
        after: uuid.UUID,
        before: uuid.UUID,
    ) -> list[Recalled]:
        """The k messages strictly between `after` and `before` nearest the embedding (cosine), nearest first,
        with their embeddings (the caller scores and chooses among them: conversation/context.py `relevant`)."""
        rows = await self._run(self._recall, (chat_id, after, before, embedding, k))
        return [
            Recalled(str(r.message_id), r.role, opened(r.content), list(r.embedding)) for r in rows
        ]

    # -- summaries ---------------------------------------------------------------------------------
    async def summaries(self, chat_id: uuid.UUID, limit: int = 1) -> list[Summary]:
        """The newest versions first."""
        rows = await self._run(self._summaries, (chat_id, limit))
        return [
            Summary(
                r.version,
                str(r.through),
                opened(r.content),
                r.tokens,
                r.run_id,
                r.created_at and utc(r.created_at),
            )
            for r in rows
        ]

    async def latest_summary(self, chat_id: uuid.UUID) -> Summary | None:
        found = await self.summaries(chat_id, 1)
        return found[0] if found else None

    async def put_summary(self, chat_id: uuid.UUID, summary: Summary, owner: str) -> None:
        await self._run(
            self._put_summary,
            (
                chat_id,
                summary.version,
                uuid.UUID(summary.through),
                seal(owner, summary.content),
                summary.tokens,
                summary.run_id,
                datetime.now(UTC),
            ),
        )

    async def drop_summary(self, chat_id: uuid.UUID, version: int) -> None:
        await self._run(self._drop_summary, (chat_id, version))

    async def drop_summaries_covering(self, chat_id: uuid.UUID, message_id: uuid.UUID) -> int:
        """Remove every summary that covers the message (an edit or a delete makes them wrong); the memory stage
        summarises again from the newest one left. Returns how many went."""
        dropped = 0
        for summary in await self.summaries(chat_id, 1000):
            if uuid.UUID(summary.through).time >= message_id.time:
                await self.drop_summary(chat_id, summary.version)
                dropped += 1
        return dropped

    async def reset(self, chat_id: uuid.UUID, at_us: int) -> None:
        """Forget the chat's embeddings of texts older than `at_us` (also those written later) and its summaries
        (a context reset, or a deleted chat)."""
        await self._run(self._forget_all, (at_us, chat_id))
        await self._run(self._drop_summaries, (chat_id,))
