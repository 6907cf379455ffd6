"""API keys: mint (shown once), list, revoke. Managed with a signed-in (JWT) credential only, so a leaked key
cannot mint itself successors that outlive its revocation.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from pydantic import BaseModel, Field

from api.auth import CurrentUser, Principal, new_key
from api.deps import Deps
from api.errors import ApiError
from storage.api_keys import ApiKey
from storage.ids import parse_id

router = APIRouter(prefix="/v1/api-keys")


class NewKey(BaseModel):
    name: str = Field("default", min_length=1, max_length=100)


def signed_in(user: Principal) -> None:
    if user.via_key:
        raise ApiError(
            403,
            "API keys are managed with a signed-in credential, not with an API key.",
            "key_not_allowed",
        )


def key_json(key: ApiKey) -> dict[str, Any]:
    return {
        "id": key.key_id,
        "object": "api_key",
        "name": key.name,
        "prefix": key.prefix,
        "tier": key.tier,
        "created_at": key.created_at.isoformat(),
        "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
    }


@router.post("", status_code=201)
async def create_key(deps: Deps, user: CurrentUser, body: NewKey | None = None) -> dict[str, Any]:
    signed_in(user)
    key, digest = new_key()
    stored = await deps.keys.create_key(
        user.user_id, user.tier, body.name if body else "default", digest, key[:7]
    )
    return {**key_json(stored), "key": key}  # the only time the key itself is ever returned


@router.get("")
async def list_keys(deps: Deps, user: CurrentUser) -> dict[str, Any]:
    signed_in(user)
    return {
        "object": "list",
        "data": [key_json(k) for k in await deps.keys.list_keys(user.user_id)],
    }


@router.delete("/{key_id}", status_code=204)
async def revoke_key(deps: Deps, user: CurrentUser, key_id: str) -> Response:
    signed_in(user)
    parsed = parse_id(key_id)
    if parsed is None or not await deps.keys.revoke_key(user.user_id, parsed):
        raise ApiError(404, f"No API key found with id '{key_id}'.", "api_key_not_found")
    return Response(status_code=204)
