"""Chats: create, list by recent activity, read, rename, delete, export, and reset a chat's context."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, Field

from api import idempotency
from api.auth import CurrentUser
from api.chat_state import erase_chat, memory_changed, owned_chat
from api.deps import (
    ConversationsDep,
    DocumentsDep,
    IdempotencyDep,
    LimitsDep,
    MemoriesDep,
    PreferencesDep,
    ProducerDep,
    SettingsDep,
    SharesDep,
)
from api.errors import ApiError
from api.idempotency import IdempotencyKey
from api.memories import MemoryOut
from api.openapi import CHAT_LINKS
from api.preferences import allowed_model, checked_instructions
from api.schemas import ChatDetail, ChatExport, ChatOut, ChatPage, ContextReset, Export, MessageOut
from storage.conversations import Conversations
from storage.idempotency import Claim
from storage.ids import decode_cursor, encode_cursor, id_time_ms, new_id, parse_id, utc
from storage.preferences import ChatSettings, Marks
from storage.rows import Chat, active_at
from storage.tree import shown

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/chats")

Limit = Annotated[int, Query(ge=1, le=100, description="how many per page")]


class NewChat(BaseModel):
    title: str = Field("New chat", max_length=200)


class ChatPatch(BaseModel):
    """What to change; a field left out stays as it is."""

    title: str | None = Field(None, min_length=1, max_length=200)
    instructions: str | None = Field(None, description="the chat's own instructions; empty: none")
    model: str | None = Field(None, description="the chat's model; null: the deployment's default")
    pinned: bool | None = Field(None, strict=True, description="list it first")
    archived: bool | None = Field(
        None, strict=True, description="leave it out of the list (GET /v1/chats?archived=true)"
    )


def activity_cursor(cursor: str | None) -> tuple[datetime, uuid.UUID] | None:
    if not cursor:
        return None
    value = decode_cursor(cursor)
    after = parse_id(value.get("after", "")) if value else None
    at = value.get("at") if value else None
    if after is None or not isinstance(at, int):
        raise ApiError(400, "The cursor is not valid.", "invalid_cursor", "cursor")
    return datetime.fromtimestamp(at / 1000, UTC), after


@router.post("", status_code=201, responses={201: {"links": CHAT_LINKS}})
async def create_chat(
    conversations: ConversationsDep,
    keys: IdempotencyDep,
    user: CurrentUser,
    key: IdempotencyKey = None,
    body: NewChat | None = None,
) -> ChatOut:
    """A new chat. With an Idempotency-Key, a retry gets the first request's chat."""
    title = body.title if body else "New chat"
    chat_id = new_id()
    if key is not None:
        wanted = Claim(idempotency.digest("create_chat", body), chat_id=str(chat_id))
        held = await idempotency.claim(keys, user, idempotency.checked(key), wanted)
        if held is not None and held.chat_id:
            _, chat = await owned_chat(conversations, user, held.chat_id)
            return ChatOut.of(chat)
    holder = idempotency.Holder(keys, user, key)
    try:
        _, created = await conversations.create_chat(user.user_id, title, chat_id)
    except BaseException as exc:
        await holder.failed(exc)
        raise
    await holder.made()
    iso = created.isoformat()
    return ChatOut(id=str(chat_id), title=title, created_at=iso, last_active_at=iso)


async def marked(
    conversations: Conversations, user_id: str, marks: dict[uuid.UUID, Marks], archived: bool
) -> list[Chat]:
    """The person's pinned (not archived) chats, or their archived ones, most recently active first."""
    ids = [c for c, m in marks.items() if (m.archived if archived else m.pinned and not m.archived)]
    rows = await asyncio.gather(*(conversations.get_chat(c) for c in ids))
    return sorted((r for r in rows if r and r.user_id == user_id), key=active_at, reverse=True)


@router.get("")
async def list_chats(
    conversations: ConversationsDep,
    preferences: PreferencesDep,
    user: CurrentUser,
    cursor: str | None = None,
    limit: Limit = 20,
    archived: Annotated[bool, Query(description="the archived chats, all at once")] = False,
) -> ChatPage:
    """The caller's chats, most recently active first (a new message moves a chat to the top); the first page
    starts with the pinned ones (beyond `limit`); archived ones only with `archived=true`."""
    marks = await preferences.marks(user.user_id)
    if archived:
        shelved = await marked(conversations, user.user_id, marks, True)
        return ChatPage(data=[ChatOut.of(r, marks[r.chat_id]) for r in shelved], next_cursor=None)
    pinned = [] if cursor else await marked(conversations, user.user_id, marks, False)
    hidden = {c for c, m in marks.items() if m.pinned or m.archived}
    after = activity_cursor(cursor)
    rows: list[Any] = []
    # the listed ones past the pinned and archived, which have their own place
    while len(rows) <= limit:
        read = await conversations.list_chats(user.user_id, limit + 1, after)
        rows += [r for r in read if r.chat_id not in hidden]
        if len(read) <= limit:
            break
        after = (read[-1].active_at, read[-1].chat_id)
    page = rows[:limit]
    next_cursor = None
    if len(rows) > limit:
        last = page[-1]
        next_cursor = encode_cursor(
            {"at": int(utc(last.active_at).timestamp() * 1000), "after": str(last.chat_id)}
        )
    first = [ChatOut.of(r, marks[r.chat_id]) for r in pinned]
    return ChatPage(data=first + [ChatOut.of(r) for r in page], next_cursor=next_cursor)


@router.get("/export")
async def export_chats(
    conversations: ConversationsDep, memories: MemoriesDep, user: CurrentUser
) -> Export:
    """Every chat of the caller with all its messages, and their memories, as one JSON document."""
    chats: list[ChatExport] = []
    after: tuple[datetime, uuid.UUID] | None = None
    while True:
        rows = await conversations.list_chats(user.user_id, 100, after)
        for row in rows:
            messages, last = [], None
            while True:
                page = await conversations.list_messages(row.chat_id, 500, last)
                messages += [MessageOut.of(m, shown(m.parent_id)) for m in page]  # every branch
                if len(page) < 500:
                    break
                last = uuid.UUID(page[-1].id)
            chats.append(ChatExport(**ChatOut.of(row).model_dump(), messages=messages))
        if len(rows) < 100:
            break
        after = (rows[-1].active_at, rows[-1].chat_id)
    exported = datetime.now(UTC).isoformat()
    kept = [MemoryOut.of(m) for m in await memories.kept(user.user_id)]
    return Export(user_id=user.user_id, exported_at=exported, chats=chats, memories=kept)


@router.get("/{chat_id}")
async def get_chat(
    conversations: ConversationsDep, preferences: PreferencesDep, user: CurrentUser, chat_id: str
) -> ChatDetail:
    """The chat, with `active_run_id` while its latest run is still answering (a reloaded page resumes it)."""
    parsed, chat = await owned_chat(conversations, user, chat_id)
    run = (
        await conversations.get_run(parsed, uuid.UUID(chat.last_run_id))
        if chat.last_run_id
        else None
    )
    active = chat.last_run_id if run and run[1] is None else None
    chosen, marks = await asyncio.gather(preferences.chat(parsed), preferences.marks(user.user_id))
    return ChatDetail(
        **ChatOut.of(chat, marks.get(parsed)).model_dump(),
        active_run_id=active,
        instructions=chosen.instructions,
        model=chosen.model,
    )


@router.patch("/{chat_id}")
async def change_chat(
    conversations: ConversationsDep,
    preferences: PreferencesDep,
    settings: SettingsDep,
    views: LimitsDep,
    user: CurrentUser,
    chat_id: str,
    body: ChatPatch,
) -> ChatDetail:
    """Rename the chat, set its instructions (counted and screened in every prompt, after the person's own), or
    choose its model (remembered for its later messages; 403 model_not_allowed for one the tier may not use).
    Everything is checked before anything is written."""
    parsed, chat = await owned_chat(conversations, user, chat_id)
    given = body.model_fields_set
    current = await preferences.chat(parsed)
    wanted = ChatSettings(
        checked_instructions(settings, body.instructions)
        if body.instructions is not None
        else current.instructions,
        body.model if "model" in given else current.model,
        current.branch,
        current.branched,
    )
    if "model" in given and body.model is not None:
        allowed_model(settings, views, user, body.model)
    if body.title is not None:
        await conversations.rename_chat(chat, body.title)
    if wanted != current:
        await preferences.set_chat(parsed, wanted, chat.user_id)
    marks = (await preferences.marks(user.user_id)).get(parsed, Marks())
    if body.pinned is not None or body.archived is not None:
        pinned = marks.pinned if body.pinned is None else body.pinned
        marks = Marks(pinned, marks.archived if body.archived is None else body.archived)
        await preferences.mark(user.user_id, parsed, marks)
    title = body.title if body.title is not None else chat.title
    return ChatDetail(
        **ChatOut.of(chat, marks).model_dump(exclude={"title"}),
        title=title,
        active_run_id=None,
        instructions=wanted.instructions,
        model=wanted.model,
    )


@router.delete("/{chat_id}", status_code=204)
async def delete_chat(
    conversations: ConversationsDep,
    preferences: PreferencesDep,
    shares: SharesDep,
    documents: DocumentsDep,
    producer: ProducerDep,
    user: CurrentUser,
    chat_id: str,
) -> Response:
    """The chat with its messages and runs; its streams can no longer be resumed (404)."""
    _, chat = await owned_chat(conversations, user, chat_id)
    await erase_chat(conversations, preferences, shares, documents, producer, chat)
    log.info("chat %s deleted by %s", chat_id, user.user_id)
    return Response(status_code=204)


@router.post("/{chat_id}/context/reset")
async def reset_context(
    conversations: ConversationsDep, producer: ProducerDep, user: CurrentUser, chat_id: str
) -> ContextReset:
    """Start the chat's context afresh: its messages stay listed, but later prompts carry none of them, no
    summary and no retrieved memory."""
    parsed, _ = await owned_chat(conversations, user, chat_id)
    marker = await conversations.reset_context(parsed)
    await memory_changed(producer, parsed, user.user_id, "reset", id_time_ms(marker))
    log.info("chat %s: context reset by %s", chat_id, user.user_id)
    return ContextReset(id=chat_id, context_from=str(marker))
