"""What a person asked Parley to remember across their chats: one row per memory, with its MiniLM embedding
searched by approximate nearest neighbour (SAI vector index) within the person's own partition, so a recall
never reaches another person's memories. The edge writes them (a person's settings, or "remember that …" in
a chat, api/memories.py); the scheduler recalls the relevant ones into a run's context (conversation/recall.py).
Design: docs/decisions/0024-memories-across-chats.md."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cassandra.cluster import Session

from storage.at_rest import opened, seal
from storage.ids import now, utc
from storage.session import Store, create_tables

SCHEMA = (
    # source: "settings", or the chat a "remember that …" message came from
    """CREATE TABLE IF NOT EXISTS {ks}.memories (
         user_id text, memory_id timeuuid, content text, embedding vector<float, 384>, source text,
         created_at timestamp, updated_at timestamp, PRIMARY KEY ((user_id), memory_id))""",
    """CREATE CUSTOM INDEX IF NOT EXISTS memories_ann ON {ks}.memories (embedding) USING 'StorageAttachedIndex'
       WITH OPTIONS = {{'similarity_function': 'cosine'}}""",
)


def create_schema(session: Session, keyspace: str) -> None:
    create_tables(session, keyspace, SCHEMA, ())


@dataclass(frozen=True)
class PersonMemory:
    id: str
    content: str
    source: str
    created_at: datetime
    updated_at: datetime
    embedding: tuple[float, ...] = ()


class Memories(Store):
    WRITERS = {"memories": "api"}

    def __init__(self, session: Session, keyspace: str, writer: str) -> None:
        super().__init__(session, keyspace, writer)
        ks, p = keyspace, self._prepare
        columns = "memory_id, content, source, created_at, updated_at"
        self._put = p(
            f"INSERT INTO {ks}.memories (user_id, memory_id, content, embedding, source, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)"
        )
        self._list = p(f"SELECT {columns} FROM {ks}.memories WHERE user_id = ? LIMIT ?")
        self._get = p(f"SELECT {columns} FROM {ks}.memories WHERE user_id = ? AND memory_id = ?")
        self._delete = p(f"DELETE FROM {ks}.memories WHERE user_id = ? AND memory_id = ?")
        self._forget = p(f"DELETE FROM {ks}.memories WHERE user_id = ?")
        self._recall = p(
            f"SELECT {columns}, embedding FROM {ks}.memories WHERE user_id = ? "
            "ORDER BY embedding ANN OF ? LIMIT ?"
        )

    @staticmethod
    def _of(r: Any, with_embedding: bool = False) -> PersonMemory:
        embedding = tuple(r.embedding) if with_embedding else ()
        return PersonMemory(
            str(r.memory_id),
            opened(r.content),
            r.source,
            utc(r.created_at),
            utc(r.updated_at),
            embedding,
        )

    async def kept(self, user_id: str, limit: int = 1000) -> list[PersonMemory]:
        """The person's memories, oldest first."""
        return [self._of(r) for r in await self._run(self._list, (user_id, limit))]

    async def get(self, user_id: str, memory_id: uuid.UUID) -> PersonMemory | None:
        row = (await self._run(self._get, (user_id, memory_id))).one()
        return self._of(row) if row is not None else None

    async def put(
        self,
        user_id: str,
        memory_id: uuid.UUID,
        content: str,
        embedding: list[float],
        source: str,
        created_at: datetime | None = None,
    ) -> PersonMemory:
        """Write a memory (a new one, or an edit keeping its first time): idempotent, keyed by its id."""
        at = now()
        first = created_at or at
        sealed = seal(user_id, content)  # at rest with their key (storage/at_rest.py)
        await self._run(self._put, (user_id, memory_id, sealed, embedding, source, first, at))
        return PersonMemory(str(memory_id), content, source, first, at)

    async def delete(self, user_id: str, memory_id: uuid.UUID) -> None:
        await self._run(self._delete, (user_id, memory_id))

    async def forget_person(self, user_id: str) -> None:
        """Every memory of the person (the whole partition, one tombstone)."""
        await self._run(self._forget, (user_id,))

    async def recall(self, user_id: str, embedding: list[float], k: int) -> list[PersonMemory]:
        """The person's k memories nearest the embedding (cosine), nearest first, with their embeddings."""
        rows = await self._run(self._recall, (user_id, embedding, k))
        return [self._of(r, with_embedding=True) for r in rows]
