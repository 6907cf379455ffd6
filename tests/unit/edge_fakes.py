"""In-memory stand-ins for the stores and the producer the edge's routes depend on, given to the app through
FastAPI's dependency overrides (api/deps.py). The real ones are tested on the real services under tests/stack/."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from api.errors import ApiError
from safety.policy import BUILTIN, Policy
from storage.api_keys import UNSCOPED, ApiKey, KeyOwner
from storage.documents import Document, Status, StoredPassage
from storage.idempotency import Claim
from storage.ids import new_id
from storage.memories import PersonMemory
from storage.preferences import ChatSettings, Marks, PersonSettings
from storage.rows import Change, Chat, Message, overlay
from storage.shares import Share

from .fakes import FakeConversations, FakeLog


def now() -> datetime:
    return datetime.now(UTC)


class FakeProducer:
    """The edge's producer: what it publishes lands in a FakeLog (encoded with the topic's schema first)."""

    def __init__(self) -> None:
        self.log = FakeLog()
        self.tombstones: list[tuple[str, str]] = []

    async def publish(self, topic: Any, record: Any, *, key: str | None = None, partition: int | None = None):
        await self.log(topic, record, key=key, partition=partition)

    async def tombstone(self, topic: Any, key: str) -> None:
        self.tombstones.append((topic.name, key))


class FakeChats(FakeConversations):
    """The conversation store's chat and message reads and writes, as the edge uses them."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: dict[tuple[uuid.UUID, uuid.UUID], tuple[int, str | None]] = {}
        self.resets: dict[uuid.UUID, uuid.UUID] = {}

    async def create_chat(
        self, user_id: str, title: str, chat_id: uuid.UUID | None = None
    ) -> tuple[uuid.UUID, datetime]:
        at = now()
        chat_id = chat_id or new_id()
        self.chats[chat_id] = Chat(chat_id, user_id, title, at, last_active_at=at)  # type: ignore[assignment]
        return chat_id, at

    async def rename_chat(self, chat: Chat, title: str) -> None:
        self.chats[chat.chat_id] = replace(chat, title=title)  # type: ignore[assignment]

    async def delete_chat(self, chat: Chat) -> None:
        self.chats.pop(chat.chat_id, None)
        self.edits.pop(chat.chat_id, None)

    async def list_chats(self, user_id: str, limit: int, after: tuple[datetime, uuid.UUID] | None) -> list[Any]:
        mine = [c for c in self.chats.values() if c.user_id == user_id]
        rows = sorted(  # rows of the chats by activity: their time is `active_at`
            (SimpleNamespace(**vars(c), active_at=c.last_active_at) for c in mine),
            key=lambda r: (r.active_at, r.chat_id),
            reverse=True,
        )
        if after is not None:
            rows = [r for r in rows if (r.active_at, r.chat_id) < after]
        return rows[:limit]

    async def get_run(self, chat_id: uuid.UUID, run_id: uuid.UUID) -> tuple[int, str | None] | None:
        return self.runs.get((chat_id, run_id))

    async def list_messages(self, chat_id: uuid.UUID, limit: int, after: uuid.UUID | None) -> list[Message]:
        rows = sorted(self.messages.get(chat_id, {}).values(), key=lambda m: uuid.UUID(m.id).time)
        rows = [m for m in rows if after is None or uuid.UUID(m.id).time > after.time]
        return overlay(rows, self.edits.get(chat_id, {}))[:limit]

    async def get_message(self, chat_id: uuid.UUID, message_id: uuid.UUID) -> Message | None:
        found = [m for m in self.messages.get(chat_id, {}).values() if m.id == str(message_id)]
        return next(iter(overlay(found, self.edits.get(chat_id, {}))), None)

    async def edit_message(
        self, chat_id: uuid.UUID, message_id: uuid.UUID, content: str | None, owner: str = ""
    ) -> datetime:
        at = now()
        self.edits.setdefault(chat_id, {})[str(message_id)] = Change(content, at)
        return at

    async def reset_context(self, chat_id: uuid.UUID) -> uuid.UUID:
        self.resets[chat_id] = marker = new_id()
        return marker


class FakeKeys:
    def __init__(self) -> None:
        self.keys: dict[str, tuple[str, str, ApiKey]] = {}  # hash -> (user, tier, key)

    async def create_key(
        self,
        user_id: str,
        tier: str,
        name: str,
        key_hash: str,
        prefix: str,
        scopes: frozenset[str] = UNSCOPED,
        expires_at: datetime | None = None,
    ) -> ApiKey:
        key = ApiKey(str(new_id()), name, prefix, tier, now(), None, scopes, expires_at)
        self.keys[key_hash] = (user_id, tier, key)
        return key

    async def key_owner(self, key_hash: str) -> KeyOwner | None:
        found = self.keys.get(key_hash)
        if found is None or found[2].revoked_at:
            return None
        user_id, tier, key = found
        return KeyOwner(user_id, tier, uuid.UUID(key.key_id), key.scopes, key.expires_at)

    async def used(self, user_id: str, key_id: uuid.UUID) -> None:
        for digest, (owner, tier, key) in self.keys.items():
            if owner == user_id and key.key_id == str(key_id):
                self.keys[digest] = (owner, tier, replace(key, last_used_at=now()))

    async def list_keys(self, user_id: str) -> list[ApiKey]:
        return [k for u, _, k in self.keys.values() if u == user_id]

    async def revoke_all(self, user_id: str) -> int:
        live = [k for u, _, k in self.keys.values() if u == user_id and k.revoked_at is None]
        for key in live:
            await self.revoke_key(user_id, uuid.UUID(key.key_id))
        return len(live)

    async def revoke_key(self, user_id: str, key_id: uuid.UUID) -> bool:
        for digest, (owner, tier, key) in self.keys.items():
            if owner == user_id and key.key_id == str(key_id):
                self.keys[digest] = (owner, tier, replace(key, revoked_at=key.revoked_at or now()))
                return True
        return False


class FakeIdempotencyKeys:
    """The claims, by (user, key): first wins."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], Claim] = {}

    async def claim(self, user_id: str, key: str, claim: Claim) -> Claim | None:
        held = self.claims.setdefault((user_id, key), claim)
        return None if held is claim else held

    async def published(self, user_id: str, key: str) -> None:
        if (user_id, key) in self.claims:
            self.claims[(user_id, key)] = replace(self.claims[(user_id, key)], published=True)

    async def release(self, user_id: str, key: str) -> None:
        self.claims.pop((user_id, key), None)


class FakePeople:
    """The browser sessions, by person: only how many each has (the routes here sign in with tokens and keys)."""

    def __init__(self) -> None:
        self.sessions: dict[str, int] = {}

    async def end_all(self, user_id: str) -> int:
        return self.sessions.pop(user_id, 0)


class FakePreferences:
    """A person's instructions and each chat's settings (storage/preferences.py)."""

    def __init__(self) -> None:
        self.people: dict[str, tuple[str, datetime]] = {}
        self.chats: dict[uuid.UUID, ChatSettings] = {}
        self.settings_of: dict[str, PersonSettings] = {}
        self.marked: dict[str, dict[uuid.UUID, Marks]] = {}

    async def settings(self, user_id: str) -> PersonSettings:
        return self.settings_of.get(user_id, PersonSettings())

    async def set_settings(self, user_id: str, settings: PersonSettings) -> None:
        self.settings_of[user_id] = settings

    async def person(self, user_id: str) -> tuple[str, datetime | None, PersonSettings]:
        own, at = self.people.get(user_id, ("", None))
        return own, at, await self.settings(user_id)

    async def instructions(self, user_id: str) -> tuple[str, datetime | None]:
        return self.people.get(user_id, ("", None))

    async def set_instructions(self, user_id: str, content: str) -> datetime:
        self.people[user_id] = (content, now())
        return self.people[user_id][1]

    async def chat(self, chat_id: uuid.UUID) -> ChatSettings:
        return self.chats.get(chat_id, ChatSettings())

    async def set_chat(self, chat_id: uuid.UUID, settings: ChatSettings, owner: str) -> None:
        self.chats[chat_id] = settings

    async def set_branch(self, chat_id: uuid.UUID, message_id: uuid.UUID | None) -> None:
        self.chats[chat_id] = replace(self.chats.get(chat_id, ChatSettings()), branch=message_id)

    async def mark_branched(self, chat_id: uuid.UUID) -> None:
        self.chats[chat_id] = replace(self.chats.get(chat_id, ChatSettings()), branched=True)

    async def forget_chat(self, user_id: str, chat_id: uuid.UUID) -> None:
        self.chats.pop(chat_id, None)
        self.marked.get(user_id, {}).pop(chat_id, None)

    async def marks(self, user_id: str) -> dict[uuid.UUID, Marks]:
        return dict(self.marked.get(user_id, {}))

    async def mark(self, user_id: str, chat_id: uuid.UUID, marks: Marks) -> None:
        mine = self.marked.setdefault(user_id, {})
        if marks.pinned or marks.archived:
            mine[chat_id] = marks
        else:
            mine.pop(chat_id, None)


class FakeMemories:
    """A person's memories (storage/memories.py); recall ranks by the dot product of the embeddings."""

    def __init__(self) -> None:
        self.people: dict[str, dict[str, PersonMemory]] = {}

    async def kept(self, user_id: str, limit: int = 1000) -> list[PersonMemory]:
        mine = sorted(self.people.get(user_id, {}).values(), key=lambda m: uuid.UUID(m.id).time)
        return mine[:limit]

    async def get(self, user_id: str, memory_id: uuid.UUID) -> PersonMemory | None:
        return self.people.get(user_id, {}).get(str(memory_id))

    async def put(self, user_id, memory_id, content, embedding, source, created_at=None) -> PersonMemory:
        at = now()
        memory = PersonMemory(str(memory_id), content, source, created_at or at, at, tuple(embedding))
        self.people.setdefault(user_id, {})[memory.id] = memory
        return memory

    async def delete(self, user_id: str, memory_id: uuid.UUID) -> None:
        self.people.get(user_id, {}).pop(str(memory_id), None)

    async def forget_person(self, user_id: str) -> None:
        self.people.pop(user_id, None)

    async def recall(self, user_id: str, embedding: list[float], k: int) -> list[PersonMemory]:
        score = lambda m: sum(a * b for a, b in zip(m.embedding, embedding, strict=True))  # noqa: E731
        return sorted(await self.kept(user_id), key=score, reverse=True)[:k]


class FakePolicies:
    """The safety policies as the edge reads them: the built-in one, or the one a test sets for every tier."""

    def __init__(self) -> None:
        self.policy = BUILTIN

    def for_tier(self, tier: str) -> Policy:
        return self.policy


class FakeMemoryGuard:
    """The edge's memory check (api/memories.py) with the classifier left out: what says to ignore something is
    refused; the embedding is a fixed unit vector. The real classifier: tests/stack/test_chat_features.py."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def checked(self, content: str, tier: str) -> list[float]:
        self.seen.append(content)
        if "ignore" in content.lower():
            raise ApiError(400, "This memory cannot be kept.", "memory_rejected", "content")
        return [1.0, 0.0, 0.0]


class FakeShares:
    """Shared snapshots (storage/shares.py)."""

    def __init__(self) -> None:
        self.shares: dict[str, Share] = {}

    async def put(self, share: Share) -> None:
        self.shares[share.share_id] = share

    async def get(self, share_id: str) -> Share | None:
        return self.shares.get(share_id)

    async def of_owner(self, owner: str) -> list[Share]:
        mine = [s for s in self.shares.values() if s.owner == owner]
        return sorted(mine, key=lambda s: s.created_at, reverse=True)

    async def revoke(self, share: Share) -> None:
        self.shares.pop(share.share_id, None)

    async def revoke_chat(self, owner: str, chat_id: uuid.UUID) -> int:
        found = [s for s in await self.of_owner(owner) if s.chat_id == chat_id]
        for share in found:
            await self.revoke(share)
        return len(found)


class FakeDocuments:
    """A chat's documents (storage/documents.py): files, statuses and passages in memory; `nearest` ranks by the
    dot product of the embeddings."""

    def __init__(self) -> None:
        self.files: dict[uuid.UUID, tuple[Document, bytes]] = {}
        self.status: dict[tuple[uuid.UUID, uuid.UUID], Status] = {}
        self.read_passages: dict[tuple[uuid.UUID, uuid.UUID], list[tuple[StoredPassage, list[float]]]] = {}

    async def put(self, document: Document, data: bytes) -> None:
        self.files[document.document_id] = (document, data)

    async def listed(self, chat_id: uuid.UUID) -> list[Document]:
        found = [d for d, _ in self.files.values() if d.chat_id == chat_id]
        return sorted(found, key=lambda d: d.document_id.time)

    async def get(self, chat_id: uuid.UUID, document_id: uuid.UUID) -> Document | None:
        found = self.files.get(document_id)
        return found[0] if found and found[0].chat_id == chat_id else None

    async def data(self, document: Document) -> bytes:
        return self.files[document.document_id][1]

    async def delete(self, document: Document) -> None:
        self.files.pop(document.document_id, None)

    async def delete_chat(self, chat_id: uuid.UUID) -> None:
        for document in await self.listed(chat_id):
            await self.delete(document)

    async def statuses(self, chat_id: uuid.UUID) -> dict[uuid.UUID, Status]:
        return {d: s for (c, d), s in self.status.items() if c == chat_id}

    async def any_read(self, chat_id: uuid.UUID) -> bool:
        return any(s.state == "ready" for s in (await self.statuses(chat_id)).values())

    async def read(self, chat_id, document_id, passages, status, owner) -> None:
        self.read_passages[(chat_id, document_id)] = [
            (StoredPassage(document_id, idx, place, content, tokens), embedding)
            for idx, place, content, tokens, embedding in passages
        ]
        self.status[(chat_id, document_id)] = status

    async def passages(self, chat_id: uuid.UUID) -> list[StoredPassage]:
        return [
            p
            for (c, _), found in sorted(self.read_passages.items(), key=lambda i: i[0][1].time)
            if c == chat_id
            for p, _ in found
        ]

    async def nearest(self, chat_id: uuid.UUID, embedding: list[float], k: int) -> list[StoredPassage]:
        found = [(p, v) for (c, _), ps in self.read_passages.items() if c == chat_id for p, v in ps]
        found.sort(key=lambda pv: -sum(a * b for a, b in zip(pv[1], embedding, strict=True)))
        return [p for p, _ in found[:k]]

    async def forget(self, chat_id: uuid.UUID, document_id: uuid.UUID) -> None:
        self.read_passages.pop((chat_id, document_id), None)
        self.status.pop((chat_id, document_id), None)

    async def forget_chat(self, chat_id: uuid.UUID) -> None:
        for key in [k for k in self.status if k[0] == chat_id]:
            await self.forget(*key)
