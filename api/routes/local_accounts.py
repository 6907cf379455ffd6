"""Local accounts, for installs without an identity provider: a name and a password (kept as an argon2id hash),
signing in to the same server-side session as the provider's sign-in (api/sessions.py).

The first account made on an install becomes its owner (compare-and-set: of two made at once, one wins); after
that, only an admin makes accounts (POST /v1/admin/local-accounts), with the role and tier they give. A wrong
name and a wrong password are refused alike, in the same time (a hash is checked either way). After
`MAX_FAILURES` failed sign-ins of one name within 15 minutes, on any replicas, that name is refused 429 until the
window passes (a password guessed online gets 10 tries a quarter hour).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Literal

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from api import sessions
from api.audit import TrailDep
from api.auth import Admin
from api.deps import Deps
from api.errors import ApiError
from api.routes.people import PersonOut
from storage.people import FAILURE_WINDOW_S, Person

log = logging.getLogger(__name__)
router = APIRouter(include_in_schema=False)
admin_router = APIRouter(prefix="/v1/admin")
HASHER = (
    PasswordHasher()
)  # argon2id, the library's defaults (RFC 9106's second recommended settings)
# checked when the name is unknown, so an unknown name costs what a wrong password does
DECOY = HASHER.hash("not any account's password")
MAX_FAILURES = 10


class Credentials(BaseModel):
    model_config = ConfigDict(extra="forbid")
    username: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._@-]+$")
    password: str = Field(min_length=12, max_length=1024)


class NewAccount(Credentials):
    role: Literal["admin", "auditor", "member"] = "member"
    tier: Literal["free", "pro", "enterprise"] = "free"


def enabled(deps: Deps) -> None:
    if not deps.settings.local_accounts_enabled:
        raise ApiError(
            404,
            "Local accounts are off here: sign in through your organisation.",
            "no_local_accounts",
        )


async def _make(deps: Deps, body: Credentials, role: str, tier: str) -> Person:
    hashed = await asyncio.to_thread(HASHER.hash, body.password)
    if not await deps.people.new_account(body.username, hashed):
        raise ApiError(409, f"The name '{body.username}' is taken.", "username_taken", "username")
    return await deps.people.signed_in(
        Person(body.username, body.username, "", role, tier, "local")
    )


@router.post("/auth/local/owner")
async def make_owner(body: Credentials, deps: Deps) -> Response:
    """The install's first account, its owner, signed in at once; refused once an owner exists."""
    enabled(deps)
    if not await deps.people.claim_owner(body.username):
        raise ApiError(409, "This install has its owner; ask them for an account.", "owner_exists")
    person = await _make(deps, body, "owner", "enterprise")
    log.info("local account %s made: the install's owner", person.user_id)
    response = JSONResponse({"user_id": person.user_id, "role": person.role}, status_code=201)
    await sessions.open_session(deps.people, deps.settings, response, person)
    return response


@router.post("/auth/local/login")
async def local_login(body: Credentials, deps: Deps) -> Response:
    enabled(deps)
    if await deps.people.failures(body.username) >= MAX_FAILURES:
        raise ApiError(
            429,
            "Too many failed sign-ins for this name; wait a quarter of an hour, or ask an admin.",
            "too_many_attempts",
            headers={"Retry-After": str(FAILURE_WINDOW_S)},
        )
    stored = await deps.people.password_hash(body.username)
    try:
        await asyncio.to_thread(HASHER.verify, stored or DECOY, body.password)
        if stored is None:
            raise VerificationError()
    except (VerificationError, InvalidHashError):
        await deps.people.failed(body.username)
        log.info("local sign-in refused for %r", body.username)
        raise ApiError(401, "The name or the password is wrong.", "invalid_credentials") from None
    await deps.people.cleared(body.username)
    if HASHER.check_needs_rehash(stored):
        await deps.people.rehash(body.username, await asyncio.to_thread(HASHER.hash, body.password))
    person = await deps.people.person(body.username)
    if (
        person is None
    ):  # the account was made but its person never recorded (a crash between the two)
        raise ApiError(403, "This account has no record here; ask an admin.", "account_disabled")
    response = JSONResponse({"user_id": person.user_id, "role": person.role, "tier": person.tier})
    await sessions.open_session(deps.people, deps.settings, response, person)
    await deps.people.seen(person.user_id)
    return response


@admin_router.post("/local-accounts", status_code=201)
async def make_account(body: NewAccount, deps: Deps, admin: Admin, trail: TrailDep) -> PersonOut:
    """A local account with the role and tier given (never owner: an install has one)."""
    enabled(deps)
    await trail(
        "people.create_local", body.username, body.username, {"role": body.role, "tier": body.tier}
    )
    return PersonOut.of(await _make(deps, body, body.role, body.tier), {})
