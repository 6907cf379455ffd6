"""Documents attached to a chat: the file as sent (in parts, in Cassandra: replicated like everything else a
chat holds, with no other store to run), and once the memory stage has read it, its passages with their
embeddings and where each is (page, slide, sheet), and how the reading went.

The edge writes the file and its row (`documents`, `document_blobs`); the memory stage writes what it read
(`document_passages`, `document_status`). All of a chat's rows are one partition per table, so deleting a chat
deletes them with one tombstone each. A document's name, its file and what was read of it are sealed with its
owner's key (storage/at_rest.py). Design: docs/decisions/0027-documents-in-a-chat.md."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cassandra.cluster import Session

from storage.at_rest import opened, opened_bytes, seal, seal_bytes
from storage.ids import now, utc
from storage.session import Store, create_tables

PART_BYTES = 512 * 1024
SCHEMA = (
    """CREATE TABLE IF NOT EXISTS {ks}.documents (
         chat_id timeuuid, document_id timeuuid, user_id text, name text, kind text, size int, parts int,
         created_at timestamp, PRIMARY KEY ((chat_id), document_id))""",
    """CREATE TABLE IF NOT EXISTS {ks}.document_blobs (
         document_id timeuuid, part int, data blob, PRIMARY KEY ((document_id), part))""",
    # state: ready | failed (code, message); passages, characters and sections read
    """CREATE TABLE IF NOT EXISTS {ks}.document_status (
         chat_id timeuuid, document_id timeuuid, state text, code text, message text, passages int,
         chars int, sections int, read_at timestamp, PRIMARY KEY ((chat_id), document_id))""",
    # place: page 3, slide 2, sheet Budget, a heading; tokens: the serving model's count of its content
    """CREATE TABLE IF NOT EXISTS {ks}.document_passages (
         chat_id timeuuid, document_id timeuuid, idx int, place text, content text, tokens int,
         embedding vector<float, 384>, PRIMARY KEY ((chat_id), document_id, idx))""",
    """CREATE CUSTOM INDEX IF NOT EXISTS document_passages_ann ON {ks}.document_passages (embedding)
       USING 'StorageAttachedIndex' WITH OPTIONS = {{'similarity_function': 'cosine'}}""",
)


def create_schema(session: Session, keyspace: str) -> None:
    create_tables(session, keyspace, SCHEMA, ())


@dataclass(frozen=True)
class Document:
    chat_id: uuid.UUID
    document_id: uuid.UUID
    user_id: str
    name: str
    kind: str
    size: int
    parts: int
    created_at: datetime


@dataclass(frozen=True)
class Status:
    state: str  # ready | failed
    code: str
    message: str
    passages: int
    chars: int
    sections: int


@dataclass(frozen=True)
class StoredPassage:
    document_id: uuid.UUID
    index: int
    place: str
    content: str
    tokens: int


class Documents(Store):
    WRITERS = {
        "documents": "api",
        "document_blobs": "api",
        "document_status": "memory",
        "document_passages": "memory",
    }

    def __init__(self, session: Session, keyspace: str, writer: str) -> None:
        super().__init__(session, keyspace, writer)
        ks, p = keyspace, self._prepare
        self._put = p(
            f"INSERT INTO {ks}.documents (chat_id, document_id, user_id, name, kind, size, parts, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self._put_part = p(
            f"INSERT INTO {ks}.document_blobs (document_id, part, data) VALUES (?, ?, ?)"
        )
        self._list = p(f"SELECT * FROM {ks}.documents WHERE chat_id = ?")
        self._get = p(f"SELECT * FROM {ks}.documents WHERE chat_id = ? AND document_id = ?")
        self._parts = p(f"SELECT data FROM {ks}.document_blobs WHERE document_id = ?")
        self._delete = p(f"DELETE FROM {ks}.documents WHERE chat_id = ? AND document_id = ?")
        self._delete_parts = p(f"DELETE FROM {ks}.document_blobs WHERE document_id = ?")
        self._delete_chat = p(f"DELETE FROM {ks}.documents WHERE chat_id = ?")
        self._statuses = p(f"SELECT * FROM {ks}.document_status WHERE chat_id = ?")
        self._put_status = p(
            f"INSERT INTO {ks}.document_status (chat_id, document_id, state, code, message, passages, chars, "
            "sections, read_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self._put_passage = p(
            f"INSERT INTO {ks}.document_passages (chat_id, document_id, idx, place, content, tokens, "
            "embedding) VALUES (?, ?, ?, ?, ?, ?, ?)"
        )
        columns = "document_id, idx, place, content, tokens"
        self._passages = p(f"SELECT {columns} FROM {ks}.document_passages WHERE chat_id = ?")
        self._nearest = p(
            f"SELECT {columns} FROM {ks}.document_passages WHERE chat_id = ? ORDER BY embedding ANN OF ? LIMIT ?"
        )
        self._forget = p(
            f"DELETE FROM {ks}.document_passages WHERE chat_id = ? AND document_id = ?"
        )
        self._forget_status = p(
            f"DELETE FROM {ks}.document_status WHERE chat_id = ? AND document_id = ?"
        )
        self._forget_chat = p(f"DELETE FROM {ks}.document_passages WHERE chat_id = ?")
        self._forget_chat_status = p(f"DELETE FROM {ks}.document_status WHERE chat_id = ?")

    # -- the edge's: the file as sent ------------------------------------------------------------------
    async def put(self, document: Document, data: bytes) -> None:
        """The parts first, then the row that lists the document: one cut short is never listed."""
        for part in range(document.parts):
            chunk = seal_bytes(document.user_id, data[part * PART_BYTES : (part + 1) * PART_BYTES])
            await self._run(self._put_part, (document.document_id, part, chunk))
        d = document
        name = seal(d.user_id, d.name)
        row = (d.chat_id, d.document_id, d.user_id, name, d.kind, d.size, d.parts, d.created_at)
        await self._run(self._put, row)

    @staticmethod
    def _document(r: Any) -> Document:
        return Document(
            r.chat_id,
            r.document_id,
            r.user_id,
            opened(r.name),
            r.kind,
            r.size,
            r.parts,
            utc(r.created_at),
        )

    async def listed(self, chat_id: uuid.UUID) -> list[Document]:
        return [self._document(r) for r in await self._run(self._list, (chat_id,))]

    async def get(self, chat_id: uuid.UUID, document_id: uuid.UUID) -> Document | None:
        row = (await self._run(self._get, (chat_id, document_id))).one()
        return self._document(row) if row is not None else None

    async def data(self, document: Document) -> bytes:
        rows = list(await self._run(self._parts, (document.document_id,)))
        if len(rows) != document.parts:
            raise LookupError(
                f"document {document.document_id}: {len(rows)} of {document.parts} parts"
            )
        return b"".join(opened_bytes(r.data) for r in rows)

    async def delete(self, document: Document) -> None:
        await self._run(self._delete, (document.chat_id, document.document_id))
        await self._run(self._delete_parts, (document.document_id,))

    async def delete_chat(self, chat_id: uuid.UUID) -> None:
        """The chat's documents and their files (the memory stage forgets what it read of them)."""
        for document in await self.listed(chat_id):
            await self._run(self._delete_parts, (document.document_id,))
        await self._run(self._delete_chat, (chat_id,))

    # -- the memory stage's: what it read ------------------------------------------------------------
    async def statuses(self, chat_id: uuid.UUID) -> dict[uuid.UUID, Status]:
        rows = await self._run(self._statuses, (chat_id,))
        return {
            r.document_id: Status(
                r.state,
                r.code or "",
                r.message or "",
                r.passages or 0,
                r.chars or 0,
                r.sections or 0,
            )
            for r in rows
        }

    async def any_read(self, chat_id: uuid.UUID) -> bool:
        """Whether the chat has a document the memory stage has read (its runs then hold passages)."""
        return any(s.state == "ready" for s in (await self.statuses(chat_id)).values())

    async def read(
        self,
        chat_id: uuid.UUID,
        document_id: uuid.UUID,
        passages: list[tuple[int, str, str, int, list[float]]],
        status: Status,
        owner: str,
    ) -> None:
        """What was read: the passages, sealed with the owner's key, then the status that makes them count (a
        reading cut short by a crash is read again whole: every write is keyed)."""
        for idx, place, content, tokens, embedding in passages:
            row = (
                chat_id,
                document_id,
                idx,
                seal(owner, place),
                seal(owner, content),
                tokens,
                embedding,
            )
            await self._run(self._put_passage, row)
        s = status
        row2 = (
            chat_id,
            document_id,
            s.state,
            s.code,
            s.message,
            s.passages,
            s.chars,
            s.sections,
            now(),
        )
        await self._run(self._put_status, row2)

    async def passages(self, chat_id: uuid.UUID) -> list[StoredPassage]:
        """Every passage of the chat's documents, in document and reading order."""
        rows = await self._run(self._passages, (chat_id,))
        return [self._passage(r) for r in rows]

    async def nearest(
        self, chat_id: uuid.UUID, embedding: list[float], k: int
    ) -> list[StoredPassage]:
        rows = await self._run(self._nearest, (chat_id, embedding, k))
        return [self._passage(r) for r in rows]

    @staticmethod
    def _passage(r: Any) -> StoredPassage:
        return StoredPassage(r.document_id, r.idx, opened(r.place), opened(r.content), r.tokens)

    async def forget(self, chat_id: uuid.UUID, document_id: uuid.UUID) -> None:
        await self._run(self._forget, (chat_id, document_id))
        await self._run(self._forget_status, (chat_id, document_id))

    async def forget_chat(self, chat_id: uuid.UUID) -> None:
        await self._run(self._forget_chat, (chat_id,))
        await self._run(self._forget_chat_status, (chat_id,))
