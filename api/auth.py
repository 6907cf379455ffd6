"""Credentials: HS256 JWTs carrying the user id and tier (issuer, audience and expiry checked), and API keys.

An API key is `pk-` + 43 url-safe characters (256 random bits). Only its SHA-256 is stored, with the owner
and the tier it was minted with; a revoked key is refused on the next request (no cache).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Annotated

import jwt
from fastapi import Depends, Request

from api.deps import KeysDep, SettingsDep
from api.errors import ApiError
from api.settings import ApiSettings

TIERS = ("free", "pro", "enterprise")


KEY_PREFIX = "pk-"


@dataclass(frozen=True)
class Principal:
    user_id: str
    tier: str
    via_key: bool = False
    # may change limits (a claim of a signed credential; API keys never carry it)
    admin: bool = False


def new_key() -> tuple[str, str]:
    """(the key to show once, its hash to store)."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, key_hash(key)


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def issue(
    secret: str,
    user: str,
    tier: str,
    issuer: str,
    audience: str,
    ttl_s: int = 30 * 24 * 3600,
    admin: bool = False,
) -> str:
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {', '.join(TIERS)}")
    now = int(time.time())
    claims: dict[str, object] = {
        "sub": user,
        "tier": tier,
        "iss": issuer,
        "aud": audience,
        "iat": now,
        "exp": now + ttl_s,
    }
    if admin:
        claims["admin"] = True
    return jwt.encode(claims, secret, algorithm="HS256")


def credential(
    user: str,
    tier: str = "pro",
    ttl_s: int = 3600,
    admin: bool = False,
    settings: ApiSettings | None = None,
) -> str:
    """A credential signed with the settings' secret (by default this machine's: the local stack's), for the
    CLI's `parley token`, the tests and the benches."""
    settings = settings or ApiSettings()
    secret = settings.jwt_secret.get_secret_value()
    return issue(secret, user, tier, settings.jwt_issuer, settings.jwt_audience, ttl_s, admin=admin)


def verify(token: str, secret: str, issuer: str, audience: str) -> Principal:
    try:
        claims = jwt.decode(
            token,
            secret,
            algorithms=["HS256"],
            issuer=issuer,
            audience=audience,
            options={"require": ["exp", "sub", "iss", "aud"]},
        )
    except jwt.ExpiredSignatureError as exc:
        raise ApiError(401, "The credential has expired.", "expired_token") from exc
    except jwt.PyJWTError as exc:
        raise ApiError(401, "The credential is not valid.", "invalid_token") from exc
    tier = claims.get("tier")
    if tier not in TIERS or not isinstance(claims["sub"], str) or not claims["sub"]:
        raise ApiError(401, "The credential is not valid.", "invalid_token")
    return Principal(claims["sub"], tier, admin=claims.get("admin") is True)


async def principal(request: Request, keys: KeysDep, settings: SettingsDep) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(
            401,
            "Missing credential: send Authorization: Bearer <token>.",
            "missing_token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    token = token.strip()
    if token.startswith(KEY_PREFIX):
        owner = await keys.key_owner(key_hash(token))
        if owner is None:
            raise ApiError(401, "The API key is not valid or has been revoked.", "invalid_api_key")
        return Principal(owner[0], owner[1], via_key=True)
    return verify(
        token, settings.jwt_secret.get_secret_value(), settings.jwt_issuer, settings.jwt_audience
    )


CurrentUser = Annotated[Principal, Depends(principal)]


async def admin_principal(user: CurrentUser) -> Principal:
    if not user.admin:
        raise ApiError(403, "This needs an admin credential.", "admin_required")
    return user


Admin = Annotated[Principal, Depends(admin_principal)]
