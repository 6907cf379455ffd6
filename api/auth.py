"""Credentials: HS256 JWTs carrying the user id and tier (issuer, audience and expiry checked)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated

import jwt
from fastapi import Depends, Request

from api.errors import ApiError

TIERS = ("free", "pro", "enterprise")


@dataclass(frozen=True)
class Principal:
    user_id: str
    tier: str


def issue(secret: str, user: str, tier: str, issuer: str, audience: str, ttl_s: int = 30 * 24 * 3600) -> str:
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {', '.join(TIERS)}")
    now = int(time.time())
    claims = {"sub": user, "tier": tier, "iss": issuer, "aud": audience, "iat": now, "exp": now + ttl_s}
    return jwt.encode(claims, secret, algorithm="HS256")


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
    return Principal(claims["sub"], tier)


def principal(request: Request) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(
            401,
            "Missing credential: send Authorization: Bearer <token>.",
            "missing_token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    settings = request.app.state.settings
    return verify(token.strip(), settings.jwt_secret.get_secret_value(), settings.jwt_issuer, settings.jwt_audience)


CurrentUser = Annotated[Principal, Depends(principal)]
