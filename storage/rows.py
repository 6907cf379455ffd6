"""The rows the conversation store hands out, as typed values: a chat, a message, a user's change to one."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from storage.at_rest import opened, seal
from storage.ids import utc


@dataclass(frozen=True)
class Chat:
    """A chat's row: its owner, title, latest run, and the markers memory reads."""

    chat_id: uuid.UUID
    user_id: str
    title: str
    created_at: datetime
    last_run_id: str | None = None
    last_active_at: datetime | None = None
    # a reset's marker: earlier messages no longer go into prompts
    context_from: uuid.UUID | None = None
    memory_changed_at: datetime | None = None  # when a message was last edited or deleted


class ChatBusy(Exception):
    """Another run of the chat opened first (storage/conversations.py `open_run`)."""


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
    parent_id: str | None = None  # storage/tree.py: None for a message stored before the tree
    memories: tuple[
        str, ...
    ] = ()  # an answer's: the person's memories its context held (storage/memories.py)
    # an answer's: the passages of the chat's documents its context held (storage/documents.py)
    sources: tuple[dict[str, Any], ...] = ()
    # an answer's: the calls it made to registered MCP servers' tools, with their results (inference/tools.py)
    tools: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Change:
    """A user's edit (the new content) or delete (content None) of a stored message."""

    content: str | None
    at: datetime


def overlay(rows: list[Message], changes: Mapping[str, Change]) -> list[Message]:
    """The messages as the user left them (pure): edited ones with their new text, deleted ones gone."""
    out = []
    for m in rows:
        change = changes.get(m.id)
        if change is None:
            out.append(m)
        elif change.content is not None:
            out.append(replace(m, content=change.content))
    return out


def deletions(changes: Mapping[str, Change]) -> int:
    """How many of a chat's messages the user deleted."""
    return sum(1 for c in changes.values() if c.content is None)


def chat_of(row: Any) -> Chat:
    return Chat(
        row.chat_id,
        row.user_id,
        opened(row.title),
        row.created_at,
        row.last_run_id,
        row.last_active_at,
        row.context_from,
        row.memory_changed_at,
    )


def active_at(chat: Chat) -> datetime:
    """Where the chat stands in its user's list: when it was last active (or made)."""
    return chat.last_active_at or chat.created_at


def change_of(row: Any) -> Change:
    return Change(opened(row.content), utc(row.changed_at))


def message_row(message: Message, owner: str) -> tuple[Any, ...]:
    """The columns a message is written as, after its chat's id, its owner's text sealed with their key (the
    feedback column is the user's alone)."""
    m = message
    return (
        uuid.UUID(m.id),
        m.role,
        seal(owner, m.content),
        m.created_at,
        m.run_id,
        m.model,
        m.finish_reason,
        m.pool,
        uuid.UUID(m.parent_id) if m.parent_id else None,
        [seal(owner, x) for x in m.memories] or None,
        seal(owner, json.dumps(list(m.sources))) if m.sources else None,
        seal(owner, json.dumps(list(m.tools))) if m.tools else None,
    )


# the messages table's columns added after it first shipped (storage/conversations.py)
MESSAGE_COLUMNS_ADDED = (
    ("messages", "pool", "text"),
    ("messages", "feedback", "text"),
    ("messages", "parent_id", "timeuuid"),  # storage/tree.py
    ("messages", "memories", "list<text>"),  # a person's memories an answer's context held
    ("messages", "sources", "text"),  # JSON: the documents' passages an answer's context held
    ("messages", "tools", "text"),  # JSON: an answer's calls to registered tools, and their results
)
# what message_row writes, in its order
WRITTEN_COLUMNS = (
    "message_id, role, content, created_at, run_id, model, finish_reason, pool, parent_id, memories, sources, "
    "tools"
)
# what message_of reads
MESSAGE_COLUMNS = (
    "message_id, role, content, created_at, run_id, model, finish_reason, pool, feedback, parent_id, "
    "memories, sources, tools"
)


def message_of(row: Any) -> Message:
    """A stored message, its owner's text opened (storage/at_rest.py)."""
    sources, tools = opened(row.sources), opened(row.tools)
    return Message(
        str(row.message_id),
        row.role,
        opened(row.content),
        utc(row.created_at),
        row.run_id,
        row.model,
        row.finish_reason,
        row.pool,
        row.feedback,
        str(row.parent_id) if row.parent_id else None,
        tuple(opened(m) for m in row.memories or ()),
        tuple(json.loads(sources)) if sources else (),
        tuple(json.loads(tools)) if tools else (),
    )
