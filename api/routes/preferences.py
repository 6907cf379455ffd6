"""A person's own instructions, read and set (`/v1/me/instructions`): they go into every chat's prompt before
the chat's own (api/preferences.py). And the person erased, by their own request (`DELETE /v1/me`,
api/erasure.py)."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from pydantic import BaseModel, Field

from api.audit import TrailDep
from api.auth import CurrentUser
from api.deps import Deps, PreferencesDep, SettingsDep
from api.erasure import Erased, erase_person
from api.preferences import checked_instructions
from api.schemas import Instructions, iso

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/me")


class InstructionsIn(BaseModel):
    content: str = Field(description="empty: none")


@router.get("/instructions")
async def get_instructions(preferences: PreferencesDep, user: CurrentUser) -> Instructions:
    content, at = await preferences.instructions(user.user_id)
    return Instructions(content=content, updated_at=iso(at))


@router.put("/instructions")
async def set_instructions(
    preferences: PreferencesDep, settings: SettingsDep, user: CurrentUser, body: InstructionsIn
) -> Instructions:
    """Every later message's prompt carries them (counted within its budget, screened for injection);
    400 instructions_too_long over `max_instruction_tokens`."""
    content = checked_instructions(settings, body.content)
    at = await preferences.set_instructions(user.user_id, content)
    log.info("%s set their instructions (%d characters)", user.user_id, len(content))
    return Instructions(content=content, updated_at=iso(at))


@router.delete("")
async def erase_me(deps: Deps, user: CurrentUser, trail: TrailDep) -> Erased:
    """Erase the person asking: their chats with everything in them, memories, instructions, settings, keys
    and sessions (api/erasure.py). Cannot be undone; the audit record keeps that it happened."""
    await trail("person.erase", user.user_id, user.user_id)
    return await erase_person(deps, user.user_id)
