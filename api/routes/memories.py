"""A person's memories across chats (`/v1/me/memories`: list, add, edit, delete one or all) and their own
settings (`/v1/me/settings`: whether their memories are recalled, and after how many days untouched their chats
are deleted: api/retention.py). Adding and editing check a memory before it is kept (api/memories.py)."""

from __future__ import annotations

import logging
import uuid
from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from api.auth import CurrentUser
from api.deps import MemoriesDep, MemoryGuardDep, PreferencesDep, SettingsDep
from api.errors import ApiError
from api.memories import MemoryOut, remember
from api.settings import MAX_DAYS
from storage.ids import parse_id
from storage.memories import Memories, PersonMemory
from storage.preferences import PersonSettings

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/me")


class MemoryIn(BaseModel):
    content: str = Field(min_length=1, description="what to remember, in the person's words")


class MemoryList(BaseModel):
    object: Literal["list"] = "list"
    data: list[MemoryOut]
    recalled: bool = Field(
        description="whether they go into the person's prompts now (both switches on)"
    )


class SettingsIn(BaseModel):
    memories: bool | None = Field(None, strict=True, description="recall my memories in my chats")
    delete_after_days: int | None = Field(
        None,
        ge=1,
        le=MAX_DAYS,
        strict=True,
        description="delete my chats untouched this many days; null: keep them",
    )


class SettingsOut(BaseModel):
    memories: bool
    memories_available: bool = Field(description="whether the deployment allows memories at all")
    delete_after_days: int | None = Field(description="the person's choice; null: kept")
    max_chat_age_days: int | None = Field(
        description="the deployment's longest keeping of an untouched chat, for everyone; null: none"
    )


async def owned(store: Memories, user_id: str, memory_id: str) -> PersonMemory:
    parsed = parse_id(memory_id)
    found = await store.get(user_id, parsed) if parsed else None
    if found is None:
        raise ApiError(404, f"No memory '{memory_id}'.", "memory_not_found")
    return found


@router.get("/memories")
async def list_memories(
    memories: MemoriesDep, preferences: PreferencesDep, settings: SettingsDep, user: CurrentUser
) -> MemoryList:
    kept = await memories.kept(user.user_id)
    mine = await preferences.settings(user.user_id)
    return MemoryList(
        data=[MemoryOut.of(m) for m in kept], recalled=settings.memories and mine.memories
    )


@router.post("/memories", status_code=201)
async def add_memory(
    memories: MemoriesDep,
    guard: MemoryGuardDep,
    settings: SettingsDep,
    user: CurrentUser,
    body: MemoryIn,
) -> MemoryOut:
    """Keep a memory: 400 memory_rejected when the safety checks refuse it, 409 too_many_memories."""
    return MemoryOut.of(await remember(settings, memories, guard, user, body.content, "settings"))


@router.patch("/memories/{memory_id}")
async def edit_memory(
    memories: MemoriesDep,
    guard: MemoryGuardDep,
    settings: SettingsDep,
    user: CurrentUser,
    memory_id: str,
    body: MemoryIn,
) -> MemoryOut:
    existing = await owned(memories, user.user_id, memory_id)
    kept = await remember(settings, memories, guard, user, body.content, existing.source, existing)
    return MemoryOut.of(kept)


@router.delete("/memories/{memory_id}", status_code=204)
async def delete_memory(memories: MemoriesDep, user: CurrentUser, memory_id: str) -> None:
    existing = await owned(memories, user.user_id, memory_id)
    await memories.delete(user.user_id, uuid.UUID(existing.id))
    log.info("%s deleted memory %s", user.user_id, existing.id)


@router.delete("/memories", status_code=204)
async def forget_all(memories: MemoriesDep, user: CurrentUser) -> None:
    await memories.forget_person(user.user_id)
    log.info("%s deleted all their memories", user.user_id)


def settings_out(settings: SettingsDep, mine: PersonSettings) -> SettingsOut:
    return SettingsOut(
        memories=mine.memories,
        memories_available=settings.memories,
        delete_after_days=mine.delete_after_days,
        max_chat_age_days=settings.max_chat_age_days,
    )


@router.get("/settings")
async def get_settings(
    preferences: PreferencesDep, settings: SettingsDep, user: CurrentUser
) -> SettingsOut:
    return settings_out(settings, await preferences.settings(user.user_id))


@router.patch("/settings")
async def change_settings(
    preferences: PreferencesDep, settings: SettingsDep, user: CurrentUser, body: SettingsIn
) -> SettingsOut:
    """A field left out stays; 400 delete_after_too_long past the deployment's longest."""
    mine = await preferences.settings(user.user_id)
    days = mine.delete_after_days
    if "delete_after_days" in body.model_fields_set:
        days = body.delete_after_days
    longest = settings.max_chat_age_days
    if days is not None and longest is not None and days > longest:
        raise ApiError(
            400,
            f"This deployment keeps an untouched chat at most {longest} days; choose {longest} or fewer.",
            "delete_after_too_long",
            "delete_after_days",
        )
    wanted = PersonSettings(mine.memories if body.memories is None else body.memories, days)
    await preferences.set_settings(user.user_id, wanted)
    log.info("%s changed their settings: memories %s, chats deleted after %s days", user.user_id,
             wanted.memories, days)  # fmt: skip
    return settings_out(settings, wanted)
