"""Admin: the people who have signed in (role, tier, disabled, last seen, usage), a person's API keys, and
disabling a person here (their sessions and keys end at once, and no new sign-in opens a session until they are
enabled again). Each read and change is on the audit record."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from api.audit import TrailDep
from api.auth import Admin
from api.deps import Deps, HttpDep, KeysDep, PeopleDep, SettingsDep
from api.erasure import Erased, erase_person
from api.errors import ApiError
from api.routes.system import metering
from api.schemas import ApiKeyList, ApiKeyOut, iso
from storage.people import Person

log = logging.getLogger(__name__)


class PersonOut(BaseModel):
    user_id: str
    name: str
    email: str
    role: str = Field(
        description="owner, admin, auditor or member, from their groups at their last sign-in"
    )
    tier: str
    source: str = Field(
        description="oidc (the identity provider), token (a development token) or local"
    )
    disabled: bool
    created_at: str | None
    last_seen: str | None
    runs: int = Field(0, description="their runs to date (0 when usage could not be read)")
    tokens: int = Field(0, description="prompt and completion tokens to date")
    cost_usd: float = 0.0

    @classmethod
    def of(cls, person: Any, usage: dict[str, Any]) -> PersonOut:
        return cls(
            user_id=person.user_id,
            name=person.name,
            email=person.email,
            role=person.role,
            tier=person.tier,
            source=person.source,
            disabled=person.disabled,
            created_at=iso(person.created_at),
            last_seen=iso(person.last_seen),
            runs=int(usage.get("runs", 0)),
            tokens=int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0)),
            cost_usd=float(usage.get("cost_usd", 0.0)),
        )


class PersonList(BaseModel):
    object: Literal["list"] = "list"
    data: list[PersonOut]


router = APIRouter(prefix="/v1/admin")
MAX_LISTED = 500


@router.get("/people")
async def list_people(
    people: PeopleDep, settings: SettingsDep, http: HttpDep, admin: Admin, trail: TrailDep
) -> PersonList:
    """Everyone who has signed in, with their usage to date."""
    await trail("read.people", "people")
    everyone = (await people.everyone())[:MAX_LISTED]

    async def usage(person: Person) -> dict[str, Any]:
        try:
            return await metering(settings, http, f"/usage/{person.user_id}")
        except ApiError:
            return {}  # the list still shows who is here when usage cannot be read

    totals = await asyncio.gather(*(usage(p) for p in everyone))
    return PersonList(data=[PersonOut.of(p, u) for p, u in zip(everyone, totals, strict=True)])


@router.get("/people/{user_id}/keys")
async def person_keys(keys: KeysDep, admin: Admin, trail: TrailDep, user_id: str) -> ApiKeyList:
    await trail("read.keys", user_id, user_id)
    return ApiKeyList(data=[ApiKeyOut.of(k) for k in await keys.list_keys(user_id)])


async def _set_disabled(people: PeopleDep, user_id: str, disabled: bool) -> Person:
    if not await people.set_disabled(user_id, disabled):
        raise ApiError(404, f"No one with id '{user_id}' has signed in here.", "person_not_found")
    person = await people.person(user_id)
    assert person is not None
    return person


@router.post("/people/{user_id}/disable")
async def disable(
    people: PeopleDep, keys: KeysDep, admin: Admin, trail: TrailDep, user_id: str
) -> PersonOut:
    """Disable a person here: every session and API key of theirs ends on its next request on every replica,
    and signing in again is refused until they are enabled."""
    if user_id == admin.user_id:
        raise ApiError(400, "You cannot disable yourself.", "invalid_value", "user_id")
    await trail("people.disable", user_id, user_id)
    person = await _set_disabled(people, user_id, True)
    sessions, revoked = await people.end_all(user_id), await keys.revoke_all(user_id)
    log.info(
        "admin %s disabled %s (%d sessions, %d keys ended)",
        admin.user_id,
        user_id,
        sessions,
        revoked,
    )
    return PersonOut.of(person, {})


@router.post("/people/{user_id}/enable")
async def enable(people: PeopleDep, admin: Admin, trail: TrailDep, user_id: str) -> PersonOut:
    await trail("people.enable", user_id, user_id)
    return PersonOut.of(await _set_disabled(people, user_id, False), {})


@router.delete("/people/{user_id}")
async def erase(deps: Deps, admin: Admin, trail: TrailDep, user_id: str) -> Erased:
    """Erase a person (someone who asked their organisation, or left): everything `DELETE /v1/me` erases."""
    await trail("person.erase", user_id, user_id)
    erased = await erase_person(deps, user_id)
    log.info("admin %s erased %s", admin.user_id, user_id)
    return erased
