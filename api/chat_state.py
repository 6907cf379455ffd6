"""The edge's reads and writes of a chat on its owner's behalf: the ownership checks every route makes (404,
never 403: no existence leak), deleting a message, which the memory stage is told of, and deleting a chat."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Literal

from api.auth import Principal
from api.errors import ApiError
from api.settings import ApiSettings
from runtime.kafka import AsyncProducer
from storage.conversations import Conversations
from storage.documents import Documents
from storage.ids import epoch_ms, parse_id
from storage.preferences import Preferences
from storage.rows import Chat, Message
from storage.shares import Shares
from topics.clock import now_ms
from topics.events import MemoryChanged
from topics.pipeline import MEMORY_CHANGED


async def owned_chat(
    conversations: Conversations, user: Principal, chat_id: str
) -> tuple[uuid.UUID, Chat]:
    """The chat if it exists and belongs to the caller; otherwise 404 (never 403: no existence leak)."""
    parsed = parse_id(chat_id)
    row = await conversations.get_chat(parsed) if parsed else None
    if row is None or row.user_id != user.user_id:
        raise ApiError(404, f"No chat found with id '{chat_id}'.", "chat_not_found")
    assert parsed is not None
    return parsed, row


async def owned_message(
    conversations: Conversations, settings: ApiSettings, chat_id: uuid.UUID, message_id: str
) -> Message:
    parsed = parse_id(message_id)
    message = await conversations.get_message(chat_id, parsed) if parsed else None
    if message is None and parsed and await conversations.get_run(chat_id, parsed) is not None:
        # An answer (its id is its run's) whose stream the client saw end, not stored yet: the persistence stage
        # writes it a moment after the run's last record. Wait for it rather than answer 404 for what exists.
        deadline = time.monotonic() + settings.answer_store_wait_s
        while message is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            message = await conversations.get_message(chat_id, parsed)
        if message is None:
            retry = {"Retry-After": "1"}
            raise ApiError(
                409,
                "This answer is still being written; retry shortly.",
                "run_in_progress",
                headers=retry,
            )
    if message is None:
        raise ApiError(
            404, f"No message found with id '{message_id}' in this chat.", "message_not_found"
        )
    return message


async def owned_run(
    conversations: Conversations, user: Principal, chat_id: str, run_id: str
) -> tuple[Chat, int, str | None]:
    """(the chat, reply partition, finish reason) of a run of one of the caller's chats; otherwise 404."""
    parsed, chat = await owned_chat(conversations, user, chat_id)
    run = parse_id(run_id)
    state = await conversations.get_run(parsed, run) if run else None
    if state is None:
        raise ApiError(404, f"No run found with id '{run_id}' in this chat.", "run_not_found")
    return chat, state[0], state[1]


async def memory_changed(
    producer: AsyncProducer,
    chat_id: uuid.UUID,
    user_id: str,
    action: Literal[
        "edited", "deleted", "reset", "chat_deleted", "document_added", "document_deleted"
    ],
    at_ms: int | None = None,
    **fields: Any,
) -> None:
    """Tell the memory stage (it re-embeds an edited message, forgets and summarises again) and persistence (it
    erases a deleted chat's messages). `at_ms`: when the change was stored (the memory stage writes at that
    time, storage/memory.py), now if not given."""
    event: MemoryChanged = {
        "event_id": str(uuid.uuid4()),
        "chat_id": str(chat_id),
        "user_id": user_id,
        "action": action,
        "message_id": fields.get("message_id"),
        "role": fields.get("role"),
        "content": fields.get("content"),
        "document_id": fields.get("document_id"),
        "at": now_ms() if at_ms is None else at_ms,
    }
    await producer.publish(MEMORY_CHANGED, event, key=str(chat_id))


async def erase_chat(
    conversations: Conversations,
    preferences: Preferences,
    shares: Shares,
    documents: Documents,
    producer: AsyncProducer,
    chat: Chat,
) -> None:
    """The chat with its messages and runs (by its owner, or by the retention sweep). The persistence and memory
    stages, told first, erase its messages and memory (and what was read of its documents); its settings,
    shares and documents go; the chat row goes last, so a delete cut short is finished by deleting again."""
    await memory_changed(producer, chat.chat_id, chat.user_id, "chat_deleted")
    await preferences.forget_chat(chat.user_id, chat.chat_id)
    await shares.revoke_chat(chat.user_id, chat.chat_id)
    await documents.delete_chat(chat.chat_id)
    await conversations.delete_chat(chat)


async def forget_message(
    conversations: Conversations,
    producer: AsyncProducer,
    chat_id: uuid.UUID,
    user: Principal,
    message: Message,
) -> None:
    """Delete a stored message, and tell the memory stage (it forgets its embedding and every summary covering
    it; until then the scheduler passes over them, conversation/gather.py)."""
    at = await conversations.edit_message(chat_id, uuid.UUID(message.id), None)
    await memory_changed(
        producer,
        chat_id,
        user.user_id,
        "deleted",
        epoch_ms(at),
        message_id=message.id,
        role=message.role,
    )
