"""A person erased: `DELETE /v1/me`, or an admin's `DELETE /v1/admin/people/{user_id}` (audited).

Their sign-ins end first (API keys deleted, browser sessions ended), so nothing new of theirs is written while
the rest goes. Then each chat is deleted as its owner would delete it (api/chat_state.py erase_chat: its
messages, memory, documents and search entries by the stages, its settings and shares here), then their
memories, instructions and settings, and their row in the directory (with a local account's password). A
`person_erased` event tells the persistence stage to delete their safety decisions and the metering stage their
search entries, and to move their usage rows under a pseudonym (storage/usage_erasure.py). Last, their data
keys are deleted (runtime/keys.py): their text in every record left in the log, in replays, exports and
backups was sealed with those keys and now reads as erased. What stays: those records' envelopes (ids, times,
counts) until the events period ends, and the audit record (docs/privacy.md)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import BaseModel

from api.chat_state import erase_chat
from api.deps import Services
from api.errors import ApiError
from topics.clock import now_ms
from topics.events import MemoryChanged
from topics.pipeline import MEMORY_CHANGED

log = logging.getLogger(__name__)


class Erased(BaseModel):
    object: Literal["person.erased"] = "person.erased"
    user_id: str
    chats: int  # deleted, each with its messages, memory, documents, shares and search entries
    memories: int
    api_keys: int
    sessions: int
    data_keys: int  # deleted: their text in the log, replays, exports and backups no longer opens


async def erase_person(deps: Services, user_id: str) -> Erased:
    if await deps.people.owner() == user_id:
        raise ApiError(
            409,
            "The install's owner cannot be erased: the install would have no one to administer it.",
            "owner_not_erasable",
        )
    person = await deps.people.person(user_id)
    keys = await deps.keys.forget_all(user_id)
    sessions = await deps.people.end_all(user_id)
    chats = 0
    everything = datetime.now(UTC) + timedelta(days=1)
    for chat_id in await deps.retention.older(user_id, everything):
        chat = await deps.conversations.get_chat(chat_id)
        if chat is None or chat.user_id != user_id:
            continue
        await erase_chat(
            deps.conversations, deps.preferences, deps.shares, deps.documents, deps.producer, chat
        )
        chats += 1
    memories = len(await deps.memories.kept(user_id))
    await deps.memories.forget_person(user_id)
    await deps.preferences.forget_person(user_id)
    await deps.responses.forget_person(user_id)
    event: MemoryChanged = {
        "event_id": str(uuid.uuid4()),
        "chat_id": "",
        "user_id": user_id,
        "action": "person_erased",
        "message_id": None,
        "role": None,
        "content": None,
        "document_id": None,
        "at": now_ms(),
    }
    await deps.producer.publish(MEMORY_CHANGED, event, key=user_id)
    if person is not None:
        await deps.people.forget(person)
    data_keys = 0
    # last: every copy of their text left anywhere reads as erased from now on
    if deps.sealing is not None:
        data_keys = await asyncio.get_running_loop().run_in_executor(
            None, deps.sealing.erase, user_id
        )
    erased = Erased(
        user_id=user_id,
        chats=chats,
        memories=memories,
        api_keys=keys,
        sessions=sessions,
        data_keys=data_keys,
    )
    log.info("person %s erased: %s", user_id, erased)
    return erased
