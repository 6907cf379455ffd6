"""Conversations in Cassandra: chats, their runs and their messages, written idempotently (the primary key is
the event's id or the request's). Each table has one writer (WRITERS): the edge writes what a request changes (a
chat, its runs as they open, the user's edits and deletes: `message_changes`); persistence what the log records
(the messages, each run's answer and its rating). A read lays the changes over the messages (`overlay`)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from cassandra.cluster import Session
from cassandra.query import PreparedStatement

from storage.at_rest import opened, seal
from storage.ids import MIN_ID, new_id, now
from storage.rows import (
    MESSAGE_COLUMNS,
    MESSAGE_COLUMNS_ADDED,
    WRITTEN_COLUMNS,
    Change,
    Chat,
    ChatBusy,
    Message,
    active_at,
    change_of,
    chat_of,
    deletions,
    message_of,
    message_row,
    overlay,
)
from storage.session import Store, create_tables

ERASE_WAIT_S = 10.0  # how long an erasing stage waits for the edge to delete a chat's row

SCHEMA = (
    # Ownership and metadata of one chat.
    """CREATE TABLE IF NOT EXISTS {ks}.chats (
         chat_id timeuuid PRIMARY KEY, user_id text, title text, created_at timestamp, last_run_id text,
         last_active_at timestamp, context_from timeuuid, memory_changed_at timestamp)""",
    # Where each run's reply stream lives, so any edge replica can replay or resume it. How a run ended is its
    # answer's finish_reason (its id is the run's), or finish_reason here: as the edge saw its stream end.
    """CREATE TABLE IF NOT EXISTS {ks}.runs (
         chat_id timeuuid, run_id timeuuid, reply_partition int, finish_reason text,
         PRIMARY KEY ((chat_id), run_id))""",
    # A run the edge may have given up on: `withdrawn` (the edge) or `taken` (the scheduler), whichever wrote
    # first, by compare-and-set (storage/withdrawals.py).
    """CREATE TABLE IF NOT EXISTS {ks}.run_fates (
         chat_id timeuuid, run_id timeuuid, fate text,
         PRIMARY KEY ((chat_id), run_id)) WITH default_time_to_live = 604800""",
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
    # The user's edits (content: the new text) and deletes (content null) of a chat's messages.
    """CREATE TABLE IF NOT EXISTS {ks}.message_changes (
         chat_id timeuuid, message_id timeuuid, content text, changed_at timestamp,
         PRIMARY KEY ((chat_id), message_id))""",
)
# Columns added after a table first shipped (table, column, type); what they hold: storage/rows.py.
COLUMNS_ADDED = (
    ("chats", "last_active_at", "timestamp"),
    ("runs", "finish_reason", "text"),
    ("chats", "context_from", "timeuuid"),
    ("chats", "memory_changed_at", "timestamp"),
    *MESSAGE_COLUMNS_ADDED,
)


def create_schema(session: Session, keyspace: str) -> None:
    create_tables(session, keyspace, SCHEMA, COLUMNS_ADDED)


class Conversations(Store):
    """Reads and writes of chats, their runs and their messages; one per process, built at start-up."""

    WRITERS = {
        "chats": "api",
        "chats_by_activity": "api",
        "runs": "api",
        # two writers, by compare-and-set only: the fence between them (storage/withdrawals.py)
        "run_fates": ("api", "scheduling"),
        "message_changes": "api",
        "messages": "persistence",
    }

    def __init__(self, session: Session, keyspace: str, writer: str) -> None:
        super().__init__(session, keyspace, writer)
        ks, p = keyspace, self._prepare
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
        self._set_context_from = p(
            f"UPDATE {ks}.chats SET context_from = ?, memory_changed_at = ? WHERE chat_id = ?"
        )
        self._set_memory_changed = p(
            f"UPDATE {ks}.chats SET memory_changed_at = ? WHERE chat_id = ?"
        )
        self._get_chats = p(
            f"SELECT chat_id, title, last_active_at FROM {ks}.chats WHERE chat_id IN ?"
        )
        self._set_active = p(f"UPDATE {ks}.chats SET last_active_at = ? WHERE chat_id = ?")
        # The chat's latest run changes only by compare-and-set: one run of a chat opens at a time.
        self._claim = p(
            f"UPDATE {ks}.chats SET last_run_id = ? WHERE chat_id = ? IF user_id = ? AND last_run_id = ?"
        )
        self._set_title = p(f"UPDATE {ks}.chats SET title = ? WHERE chat_id = ?")
        self._delete_chat = p(f"DELETE FROM {ks}.chats WHERE chat_id = ?")
        self._delete_messages = p(f"DELETE FROM {ks}.messages WHERE chat_id = ?")
        self._delete_message = p(f"DELETE FROM {ks}.messages WHERE chat_id = ? AND message_id = ?")
        self._delete_changes = p(f"DELETE FROM {ks}.message_changes WHERE chat_id = ?")
        self._delete_runs = p(f"DELETE FROM {ks}.runs WHERE chat_id = ?")
        self._insert_run = p(
            f"INSERT INTO {ks}.runs (chat_id, run_id, reply_partition) VALUES (?, ?, ?)"
        )
        self._get_run = p(
            f"SELECT reply_partition, finish_reason FROM {ks}.runs WHERE chat_id = ? AND run_id = ?"
        )
        self._end_run = p(  # never a row of a deleted chat's run
            f"UPDATE {ks}.runs SET finish_reason = ? WHERE chat_id = ? AND run_id = ? IF EXISTS"
        )
        self._settle_fate = p(
            f"INSERT INTO {ks}.run_fates (chat_id, run_id, fate) VALUES (?, ?, ?) IF NOT EXISTS"
        )
        self._get_fate = p(f"SELECT fate FROM {ks}.run_fates WHERE chat_id = ? AND run_id = ?")
        self._delete_fates = p(f"DELETE FROM {ks}.run_fates WHERE chat_id = ?")
        self._run_end = p(
            f"SELECT finish_reason FROM {ks}.messages WHERE chat_id = ? AND message_id = ?"
        )
        self._list_chats = p(
            f"SELECT active_at, chat_id, title, created_at FROM {ks}.chats_by_activity WHERE user_id = ? LIMIT ?"
        )
        self._list_chats_after = p(
            f"SELECT active_at, chat_id, title, created_at FROM {ks}.chats_by_activity "
            "WHERE user_id = ? AND (active_at, chat_id) < (?, ?) LIMIT ?"
        )
        marks = ", ".join("?" * (len(WRITTEN_COLUMNS.split(",")) + 1))
        self._insert_message = p(
            f"INSERT INTO {ks}.messages (chat_id, {WRITTEN_COLUMNS}) VALUES ({marks})"
        )
        self._skeleton = p(
            f"SELECT message_id, parent_id, role FROM {ks}.messages WHERE chat_id = ?"
        )
        columns = MESSAGE_COLUMNS
        self._list_messages = p(
            f"SELECT {columns} FROM {ks}.messages WHERE chat_id = ? AND message_id > ? LIMIT ?"
        )
        self._messages_after = p(
            f"SELECT {columns} FROM {ks}.messages WHERE chat_id = ? AND message_id > ? ORDER BY message_id DESC LIMIT ?"
        )
        self._one_message = p(
            f"SELECT {columns} FROM {ks}.messages WHERE chat_id = ? AND message_id = ?"
        )
        self._set_feedback = p(
            f"UPDATE {ks}.messages SET feedback = ? WHERE chat_id = ? AND message_id = ?"
        )
        self._put_change = p(
            f"INSERT INTO {ks}.message_changes (chat_id, message_id, content, changed_at) VALUES (?, ?, ?, ?)"
        )
        self._changes = p(
            f"SELECT message_id, content, changed_at FROM {ks}.message_changes WHERE chat_id = ?"
        )
        self._change = p(
            f"SELECT message_id, content, changed_at FROM {ks}.message_changes WHERE chat_id = ? AND message_id = ?"
        )

    # -- chats -------------------------------------------------------------------------------------
    async def create_chat(
        self, user_id: str, title: str, chat_id: uuid.UUID | None = None
    ) -> tuple[uuid.UUID, datetime]:
        chat_id, at = chat_id or new_id(), now()
        # Either alone is invisible: a chat is listed only through both, and nobody has its id before the 201.
        sealed = seal(user_id, title)  # the owner's words, at rest too (storage/at_rest.py)
        await self._all(
            (self._insert_chat, (chat_id, user_id, sealed, at, at)),
            (self._insert_activity, (user_id, at, chat_id, sealed, at)),
        )
        return chat_id, at

    async def get_chat(self, chat_id: uuid.UUID) -> Chat | None:
        row = (await self._run(self._get_chat, (chat_id,))).one()
        return None if row is None else chat_of(row)

    async def deleted(self, chat_id: uuid.UUID, wait_s: float = 0.0) -> bool:
        """Whether the chat's row is gone, waited for up to `wait_s` (a stage erasing a deleted chat is told
        before the row goes). False after the wait: a delete cut short (deleting again tells the stages again)."""
        deadline = time.monotonic() + wait_s
        while await self.get_chat(chat_id) is not None:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def rename_chat(self, chat: Chat, title: str) -> None:
        active, sealed = active_at(chat), seal(chat.user_id, title)
        await self._all(  # the list shows the chat row's title; the activity row's is a copy
            (self._set_title, (sealed, chat.chat_id)),
            (self._insert_activity, (chat.user_id, active, chat.chat_id, sealed, chat.created_at)),
        )

    async def delete_chat(self, chat: Chat) -> None:
        """The chat, its runs (its streams can no longer be resumed) and the user's changes; the persistence and
        memory stages, told first, erase its messages and memory (api/routes/chats.py). Content goes first, the
        chat last: a delete cut short leaves the chat listed, and deleting it again finishes (nothing unowned)."""
        await self._all(
            (self._delete_changes, (chat.chat_id,)),
            (self._delete_runs, (chat.chat_id,)),
            (self._delete_fates, (chat.chat_id,)),
        )
        await self._run(self._delete_activity, (chat.user_id, active_at(chat), chat.chat_id))
        await self._run(self._delete_chat, (chat.chat_id,))

    async def list_chats(
        self, user_id: str, limit: int, after: tuple[datetime, uuid.UUID] | None
    ) -> list[Any]:
        """A page of the user's chats, most recently active first; stale activity rows are skipped."""
        found: list[Any] = []
        while len(found) < limit:
            if after is None:
                rows = list(await self._run(self._list_chats, (user_id, limit)))
            else:
                rows = list(
                    await self._run(self._list_chats_after, (user_id, after[0], after[1], limit))
                )
            if not rows:
                break
            current = {
                r.chat_id: r for r in await self._run(self._get_chats, ([r.chat_id for r in rows],))
            }
            for row in rows:
                chat = current.get(row.chat_id)
                if chat is not None and chat.last_active_at == row.active_at:
                    found.append(row._replace(title=opened(chat.title)))
            if len(rows) < limit:
                break
            after = (rows[-1].active_at, rows[-1].chat_id)
        return found[:limit]

    # -- runs --------------------------------------------------------------------------------------
    async def open_run(self, chat: Chat, run_id: uuid.UUID, reply_partition: int) -> None:
        """Record a new run (where its stream lives), the chat's latest (by compare-and-set: ChatBusy when another
        opened since `chat` was read) and the chat active. See `leave_old_place`."""
        if not await self._swap_latest(chat, chat.last_run_id, str(run_id)):
            raise ChatBusy(str(chat.chat_id))
        at = now()
        listed = (chat.user_id, at, chat.chat_id, seal(chat.user_id, chat.title), chat.created_at)
        try:  # in this order, a failure between writes leaves the chat listed once, at its old or new place
            run = (chat.chat_id, run_id, reply_partition)
            await self._all((self._insert_run, run), (self._insert_activity, listed))
            await self._run(self._set_active, (at, chat.chat_id))
        except Exception:
            await self._swap_latest(chat, str(run_id), chat.last_run_id)  # best effort
            raise

    async def _swap_latest(self, chat: Chat, expected: str | None, new: str | None) -> bool:
        swap = (new, chat.chat_id, chat.user_id, expected)
        return bool((await self._run(self._claim, swap)).one()[0])

    async def leave_old_place(self, chat: Chat) -> None:
        """After `open_run`: the chat's old activity row, stale from then on (a list skips it until it goes)."""
        await self._run(self._delete_activity, (chat.user_id, active_at(chat), chat.chat_id))

    async def withdraw_run(self, chat: Chat, run_id: uuid.UUID) -> None:
        """A run whose prompt never reached the log: ended, the one before it the latest again (same place)."""
        await self.end_run(chat.chat_id, run_id, "not_accepted")
        await self._swap_latest(chat, str(run_id), chat.last_run_id)

    async def end_run(self, chat_id: uuid.UUID, run_id: uuid.UUID, finish_reason: str) -> None:
        """How a run ended, as the edge saw its stream end (its answer, stored a moment later, says the same)."""
        await self._run(self._end_run, (finish_reason, chat_id, run_id))

    async def settle_fate(self, chat_id: uuid.UUID, run_id: uuid.UUID, fate: str) -> str:
        """Decide a run's fate unless it was decided already; returns the fate that holds (a retry: the same)."""
        row = (await self._run(self._settle_fate, (chat_id, run_id, fate))).one()
        return fate if row[0] else str(row.fate)

    async def fate(self, chat_id: uuid.UUID, run_id: uuid.UUID) -> str | None:
        return getattr((await self._run(self._get_fate, (chat_id, run_id))).one(), "fate", None)

    async def get_run(self, chat_id: uuid.UUID, run_id: uuid.UUID) -> tuple[int, str | None] | None:
        """(reply partition, finish reason or None while it runs), or None when the chat has no such run. Ended
        once its stream did (`end_run`), its answer is stored (its id is the run's), or it was withdrawn."""
        run, answer = await asyncio.gather(
            self._run(self._get_run, (chat_id, run_id)), self._run(self._run_end, (chat_id, run_id))
        )
        row, end = run.one(), answer.one()
        if row is None:
            return None
        return int(row.reply_partition), row.finish_reason or (end.finish_reason if end else None)

    # -- messages ----------------------------------------------------------------------------------
    async def changes(self, chat_id: uuid.UUID) -> dict[str, Change]:
        """The user's edits and deletes of the chat's messages, by message id."""
        rows = await self._run(self._changes, (chat_id,))
        return {str(r.message_id): change_of(r) for r in rows}

    async def list_messages(
        self, chat_id: uuid.UUID, limit: int, after: uuid.UUID | None
    ) -> list[Message]:
        """A page of the chat's messages as the user left them, oldest first."""
        changes = await self.changes(chat_id)
        page = (chat_id, after or MIN_ID, limit + deletions(changes))
        rows = await self._run(self._list_messages, page)
        return overlay([message_of(r) for r in rows], changes)[:limit]

    async def messages_after(
        self,
        chat_id: uuid.UUID,
        after: uuid.UUID | None,
        limit: int,
        changes: Mapping[str, Change] | None = None,
    ) -> list[Message]:
        """The newest `limit` messages later than `after` (all of the chat's when None) as the user left them,
        oldest first; `changes` when the caller has read them already."""
        if changes is None:
            changes = await self.changes(chat_id)
        rows = await self._run(
            self._messages_after, (chat_id, after or MIN_ID, limit + deletions(changes))
        )
        return overlay([message_of(r) for r in reversed(list(rows))], changes)[-limit:]

    async def get_message(self, chat_id: uuid.UUID, message_id: uuid.UUID) -> Message | None:
        rows, changes = await asyncio.gather(
            self._run(self._one_message, (chat_id, message_id)),
            self._run(self._change, (chat_id, message_id)),
        )
        found = overlay(
            [message_of(r) for r in rows], {str(r.message_id): change_of(r) for r in changes}
        )
        return found[0] if found else None

    async def edit_message(
        self, chat_id: uuid.UUID, message_id: uuid.UUID, content: str | None, owner: str = ""
    ) -> datetime:
        """A user's edit (None: a delete); returns its time. The change is marked first: a summary begun before
        it is discarded even if the edit itself fails."""
        at = now()
        await self._run(self._set_memory_changed, (at, chat_id))
        await self._run(self._put_change, (chat_id, message_id, seal(owner, content), at))
        return at

    async def erase_messages(self, chat_id: uuid.UUID) -> None:
        """Every message of a deleted chat (the persistence stage, told by the edge)."""
        await self._run(self._delete_messages, (chat_id,))

    async def unput_message(self, chat_id: uuid.UUID, message_id: uuid.UUID) -> None:
        """Remove a stored turn (persistence: the question of a run the edge withdrew, storage/withdrawals.py)."""
        await self._run(self._delete_message, (chat_id, message_id))

    async def reset_context(self, chat_id: uuid.UUID) -> uuid.UUID:
        """Later prompts start from here: the chat's earlier messages stay listed but leave its memory."""
        marker = new_id()
        await self._run(self._set_context_from, (marker, now(), chat_id))
        return marker

    async def skeleton(self, chat_id: uuid.UUID) -> list[tuple[str, str | None, str]]:
        """Every stored message of the chat as (id, parent id or None, role), in time order, deleted ones
        included (a branch runs through them): what storage/tree.py builds the chat's tree from."""
        rows = await self._run(self._skeleton, (chat_id,))
        return [
            (str(r.message_id), str(r.parent_id) if r.parent_id else None, r.role) for r in rows
        ]

    async def has_message(self, chat_id: uuid.UUID, message_id: uuid.UUID) -> bool:
        return (await self._run(self._run_end, (chat_id, message_id))).one() is not None

    async def put_message(self, chat_id: uuid.UUID, message: Message, owner: str = "") -> None:
        """Idempotent (a redelivered event rewrites its row); the owner's text sealed with their key."""
        await self._run(self._insert_message, (chat_id, *message_row(message, owner)))

    async def set_feedback(
        self, chat_id: uuid.UUID, message_id: uuid.UUID, rating: str | None
    ) -> bool:
        """Record the user's rating of a stored message (None clears it); False when there is no such message
        (an update would create a row holding only the rating) or the user deleted it."""
        if await self.get_message(chat_id, message_id) is None:
            return False
        await self._run(self._set_feedback, (rating, chat_id, message_id))
        return True
