"""API keys: mint (shown once), list, revoke. Managed with a signed-in (JWT) credential only, so a leaked key
cannot mint itself successors that outlive its revocation.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

from fastapi import APIRouter, Response
from pydantic import BaseModel, Field

from api.auth import CurrentUser, Principal, new_key
from api.deps import KeysDep
from api.errors import ApiError
from api.openapi import KEY_LINKS
from api.schemas import ApiKeyList, ApiKeyOut, NewApiKey
from storage.ids import parse_id

router = APIRouter(prefix="/v1/api-keys")


Scope = Literal["chat", "openai", "usage", "admin"]


class NewKey(BaseModel):
    name: str = Field("default", min_length=1, max_length=100)
    scopes: list[Scope] = Field(
        ["chat", "openai", "usage"],
        min_length=1,
        description="chat: the chat routes; openai: the OpenAI-compatible routes; usage: reading one's usage; "
        "admin: the admin routes (only an admin may mint it)",
    )
    expires_in_days: int | None = Field(
        90, ge=1, le=3650, strict=True, description="null: the key never expires (until revoked)"
    )


def signed_in(user: Principal) -> None:
    if user.via_key:
        raise ApiError(
            403,
            "API keys are managed with a signed-in credential, not with an API key.",
            "key_not_allowed",
        )


@router.post("", status_code=201, responses={201: {"links": KEY_LINKS}})
async def create_key(keys: KeysDep, user: CurrentUser, body: NewKey | None = None) -> NewApiKey:
    signed_in(user)
    body = body or NewKey()
    if "admin" in body.scopes and not user.admin:
        raise ApiError(
            403, "Only an admin may mint a key with the admin scope.", "admin_required", "scopes"
        )
    key, digest = new_key()
    days = body.expires_in_days
    expires = datetime.now(UTC) + timedelta(days=days) if days is not None else None
    scopes = frozenset(body.scopes)
    stored = await keys.create_key(
        user.user_id, user.tier, body.name, digest, key[:7], scopes, expires
    )
    return NewApiKey(
        **ApiKeyOut.of(stored).model_dump(), key=key
    )  # the only time the key is returned


@router.get("")
async def list_keys(keys: KeysDep, user: CurrentUser) -> ApiKeyList:
    signed_in(user)
    return ApiKeyList(data=[ApiKeyOut.of(k) for k in await keys.list_keys(user.user_id)])


@router.delete("/{key_id}", status_code=204)
async def revoke_key(keys: KeysDep, user: CurrentUser, key_id: str) -> Response:
    signed_in(user)
    parsed = parse_id(key_id)
    if parsed is None or not await keys.revoke_key(user.user_id, parsed):
        raise ApiError(404, f"No API key found with id '{key_id}'.", "api_key_not_found")
    return Response(status_code=204)
