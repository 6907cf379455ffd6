"""What a person sets for their own chats: their instructions (every chat) and each chat's instructions and
model. The edge reads them when it opens a run and puts them into the run's prompt event, so the scheduler,
a replay and `parley runs show` see exactly what went into the context (conversation/gather.py)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from cassandra.cluster import Session

from storage.at_rest import opened, seal
from storage.ids import now, utc
from storage.session import Store, create_tables

SCHEMA = (
    # memories: recall the person's memories into their chats (null: on); delete_after_days: their chats
    # untouched that long are deleted (null: kept, up to the deployment's longest: api/retention.py)
    """CREATE TABLE IF NOT EXISTS {ks}.person_settings (
         user_id text PRIMARY KEY, instructions text, memories boolean, delete_after_days int,
         updated_at timestamp)""",
    # one row per chat that has its own instructions or model; deleted with the chat (api/routes/chats.py)
    # branch: the message the person chose the chat's current branch by (storage/tree.py); null: the newest;
    # branched: the chat has more than one branch (until then a run's context needs no tree)
    """CREATE TABLE IF NOT EXISTS {ks}.chat_settings (
         chat_id timeuuid PRIMARY KEY, instructions text, model text, branch timeuuid, branched boolean,
         updated_at timestamp)""",
    # a person's pinned and archived chats, one partition (read whole with every listing of their chats); a
    # row goes when neither holds; deleted with the chat
    """CREATE TABLE IF NOT EXISTS {ks}.chat_marks (
         user_id text, chat_id timeuuid, pinned boolean, archived boolean, PRIMARY KEY ((user_id), chat_id))""",
)


def create_schema(session: Session, keyspace: str) -> None:
    create_tables(session, keyspace, SCHEMA, ())


@dataclass(frozen=True)
class ChatSettings:
    instructions: str = ""
    model: str | None = None  # None: the deployment's default
    branch: uuid.UUID | None = (
        None  # the message the current branch was chosen by; None: the newest
    )
    branched: bool = False  # the chat has more than one branch


@dataclass(frozen=True)
class PersonSettings:
    memories: bool = True
    delete_after_days: int | None = None


@dataclass(frozen=True)
class Marks:
    pinned: bool = False
    archived: bool = False


class Preferences(Store):
    WRITERS = {"person_settings": "api", "chat_settings": "api", "chat_marks": "api"}

    def __init__(self, session: Session, keyspace: str, writer: str) -> None:
        super().__init__(session, keyspace, writer)
        ks, p = keyspace, self._prepare
        self._put_instructions = p(
            f"INSERT INTO {ks}.person_settings (user_id, instructions, updated_at) VALUES (?, ?, ?)"
        )
        self._get_person = p(
            f"SELECT instructions, updated_at, memories, delete_after_days FROM {ks}.person_settings "
            "WHERE user_id = ?"
        )
        self._put_settings = p(
            f"UPDATE {ks}.person_settings SET memories = ?, delete_after_days = ?, updated_at = ? "
            "WHERE user_id = ?"
        )
        self._put_chat = p(
            f"INSERT INTO {ks}.chat_settings (chat_id, instructions, model, updated_at) VALUES (?, ?, ?, ?)"
        )
        self._get_chat = p(
            f"SELECT instructions, model, branch, branched FROM {ks}.chat_settings WHERE chat_id = ?"
        )
        self._set_branch = p(f"UPDATE {ks}.chat_settings SET branch = ? WHERE chat_id = ?")
        self._branched = p(f"UPDATE {ks}.chat_settings SET branched = true WHERE chat_id = ?")
        self._forget_chat = p(f"DELETE FROM {ks}.chat_settings WHERE chat_id = ?")
        self._forget_person = p(f"DELETE FROM {ks}.person_settings WHERE user_id = ?")
        self._unmark_all = p(f"DELETE FROM {ks}.chat_marks WHERE user_id = ?")
        self._marks = p(f"SELECT chat_id, pinned, archived FROM {ks}.chat_marks WHERE user_id = ?")
        self._mark = p(
            f"INSERT INTO {ks}.chat_marks (user_id, chat_id, pinned, archived) VALUES (?, ?, ?, ?)"
        )
        self._unmark = p(f"DELETE FROM {ks}.chat_marks WHERE user_id = ? AND chat_id = ?")

    async def person(self, user_id: str) -> tuple[str, datetime | None, PersonSettings]:
        """A person's own instructions ("" when none), when their row was last set, and their settings: the
        one row, read once."""
        row = (await self._run(self._get_person, (user_id,))).one()
        if row is None:
            return "", None, PersonSettings()
        at = utc(row.updated_at) if row.updated_at else None
        return (
            opened(row.instructions) or "",
            at,
            PersonSettings(row.memories is not False, row.delete_after_days),
        )

    async def instructions(self, user_id: str) -> tuple[str, datetime | None]:
        """A person's own instructions ("" when none) and when they were last set."""
        own, at, _ = await self.person(user_id)
        return own, at

    async def set_instructions(self, user_id: str, content: str) -> datetime:
        at = now()
        await self._run(self._put_instructions, (user_id, seal(user_id, content), at))
        return at

    async def settings(self, user_id: str) -> PersonSettings:
        return (await self.person(user_id))[2]

    async def set_settings(self, user_id: str, settings: PersonSettings) -> None:
        values = (settings.memories, settings.delete_after_days, now(), user_id)
        await self._run(self._put_settings, values)

    async def chat(self, chat_id: uuid.UUID) -> ChatSettings:
        row = (await self._run(self._get_chat, (chat_id,))).one()
        if row is None:
            return ChatSettings()
        instructions = opened(row.instructions) or ""
        return ChatSettings(instructions, row.model, row.branch, bool(row.branched))

    async def set_chat(self, chat_id: uuid.UUID, settings: ChatSettings, owner: str) -> None:
        """The chat's instructions sealed with its owner's key (storage/at_rest.py)."""
        sealed = seal(owner, settings.instructions)
        await self._run(self._put_chat, (chat_id, sealed, settings.model, now()))

    async def set_branch(self, chat_id: uuid.UUID, message_id: uuid.UUID | None) -> None:
        await self._run(self._set_branch, (message_id, chat_id))

    async def mark_branched(self, chat_id: uuid.UUID) -> None:
        await self._run(self._branched, (chat_id,))

    async def forget_chat(self, user_id: str, chat_id: uuid.UUID) -> None:
        await self._all((self._forget_chat, (chat_id,)), (self._unmark, (user_id, chat_id)))

    async def forget_person(self, user_id: str) -> None:
        """The person's instructions, settings and chat marks (each chat's own go with the chat)."""
        await self._all((self._forget_person, (user_id,)), (self._unmark_all, (user_id,)))

    async def marks(self, user_id: str) -> dict[uuid.UUID, Marks]:
        """The person's pinned and archived chats."""
        rows = await self._run(self._marks, (user_id,))
        return {r.chat_id: Marks(bool(r.pinned), bool(r.archived)) for r in rows}

    async def mark(self, user_id: str, chat_id: uuid.UUID, marks: Marks) -> None:
        if marks.pinned or marks.archived:
            await self._run(self._mark, (user_id, chat_id, marks.pinned, marks.archived))
        else:
            await self._run(self._unmark, (user_id, chat_id))
