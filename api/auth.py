"""Credentials: browser sessions (api/sessions.py), API keys, and, where `dev_tokens` is on, HS256 JWTs carrying
the user id, tier and role (issuer, audience and expiry checked).

Roles, least to most: member; auditor (reads the audit log); admin (limits, safety policies, people, others'
runs, each read of another person's data on the audit record); owner (both).

An API key is `pk-` + 43 url-safe characters (256 random bits). Only its SHA-256 is stored, with the owner,
the tier it was minted with, its scopes and its expiry; a revoked or expired key is refused on the next request
on every replica (no cache), and one used outside its scopes is refused 403. Its last use is recorded at most
once a minute per replica.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated

import jwt
from fastapi import Depends, Request

from api import sessions
from api.deps import KeysDep, PeopleDep, ProviderDep, SettingsDep
from api.errors import ApiError
from api.oidc import ROLES
from api.settings import ApiSettings
from storage.api_keys import ApiKeys, KeyOwner

log = logging.getLogger(__name__)
TIERS = ("free", "pro", "enterprise")


KEY_PREFIX = "pk-"


@dataclass(frozen=True)
class Principal:
    user_id: str
    tier: str
    via_key: bool = False
    # may change limits (an owner's or admin's session or token, or an admin-scoped key an admin minted)
    admin: bool = False
    role: str = "member"
    session: bool = False  # signed in by a browser session (api/sessions.py)
    csrf: str = field(default="", repr=False)  # that session's CSRF token, for the app (/v1/me)

    @staticmethod
    def administers(role: str) -> bool:
        """The roles that may administer (limits, people, policies, others' runs)."""
        return role in ("owner", "admin")

    @property
    def auditor(self) -> bool:
        """May read the audit log."""
        return self.role in ("owner", "auditor")


# the scopes a key needs for each family of routes (by path prefix; the first that matches); other routes
# (`/v1/me`) take any key, and key management none (api/routes/keys.py)
ROUTE_SCOPES = (
    ("/v1/admin", {"admin"}),
    ("/v1/usage", {"usage"}),
    ("/v1/chat/completions", {"openai"}),
    ("/v1/embeddings", {"openai"}),
    ("/v1/responses", {"openai"}),
    ("/v1/models", {"openai", "chat"}),
    ("/v1/chats", {"chat"}),
)
LAST_USED_EVERY_S = 60.0
_last_used: dict[str, float] = {}  # key hash -> when this replica last recorded its use (monotonic)
_recording: set[asyncio.Task[None]] = set()


def needed_scopes(path: str) -> set[str] | None:
    return next((scopes for prefix, scopes in ROUTE_SCOPES if path.startswith(prefix)), None)


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
    role: str | None = None,
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
    if role:
        claims["role"] = role
    return jwt.encode(claims, secret, algorithm="HS256")


def credential(
    user: str,
    tier: str = "pro",
    ttl_s: int = 3600,
    admin: bool = False,
    settings: ApiSettings | None = None,
    role: str | None = None,
) -> str:
    """A credential signed with the settings' secret (by default this machine's: the local stack's), for the
    CLI's `parley token`, the tests and the benches."""
    settings = settings or ApiSettings()
    secret = settings.jwt_secret.get_secret_value()
    return issue(
        secret,
        user,
        tier,
        settings.jwt_issuer,
        settings.jwt_audience,
        ttl_s,
        admin=admin,
        role=role,
    )


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
    tier, role = claims.get("tier"), claims.get("role")
    if role is None:
        role = "admin" if claims.get("admin") is True else "member"
    if (
        tier not in TIERS
        or role not in ROLES
        or not isinstance(claims["sub"], str)
        or not claims["sub"]
    ):
        raise ApiError(401, "The credential is not valid.", "invalid_token")
    return Principal(claims["sub"], tier, admin=Principal.administers(role), role=role)


async def principal(
    request: Request, keys: KeysDep, settings: SettingsDep, people: PeopleDep, provider: ProviderDep
) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header and sessions.COOKIE in request.cookies:
        s = await sessions.current(request, people, settings, provider)
        admin = Principal.administers(s.role)
        return Principal(s.user_id, s.tier, admin=admin, role=s.role, session=True, csrf=s.csrf)
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(
            401,
            "Missing credential: sign in, or send Authorization: Bearer <API key>.",
            "missing_token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    token = token.strip()
    if token.startswith(KEY_PREFIX):
        return await key_principal(request, keys, key_hash(token))
    return dev_token(token, settings)


def dev_token(token: str, settings: ApiSettings) -> Principal:
    if not settings.dev_tokens:
        raise ApiError(
            401,
            "Signed development tokens are not accepted here: sign in, or use an API key.",
            "invalid_token",
        )
    return verify(
        token, settings.jwt_secret.get_secret_value(), settings.jwt_issuer, settings.jwt_audience
    )


async def key_principal(request: Request, keys: ApiKeys, digest: str) -> Principal:
    owner = await keys.key_owner(digest)
    if owner is None:
        raise ApiError(401, "The API key is not valid or has been revoked.", "invalid_api_key")
    if owner.expires_at is not None and owner.expires_at <= datetime.now(UTC):
        raise ApiError(401, "The API key has expired.", "expired_api_key")
    route = request.scope.get("route")
    needed = needed_scopes(getattr(route, "path", request.url.path))
    if needed is not None and not needed & owner.scopes:
        raise ApiError(
            403,
            f"This API key's scopes ({', '.join(sorted(owner.scopes))}) do not cover this route: it needs "
            f"{' or '.join(sorted(needed))}.",
            "insufficient_scope",
        )
    mark_used(keys, digest, owner)
    return Principal(owner.user_id, owner.tier, via_key=True, admin="admin" in owner.scopes)


def mark_used(keys: ApiKeys, digest: str, owner: KeyOwner) -> None:
    """Record the key's use off the request's path, at most once per LAST_USED_EVERY_S on this replica."""
    now = time.monotonic()
    if now - _last_used.get(digest, -LAST_USED_EVERY_S) < LAST_USED_EVERY_S:
        return
    if len(_last_used) > 100_000:  # bounded: forgetting only means recording a use again
        _last_used.clear()
    _last_used[digest] = now

    async def record() -> None:
        try:
            await keys.used(owner.user_id, owner.key_id)
        except Exception:
            log.warning("API key %s of %s: its last use not recorded", owner.key_id, owner.user_id)

    task = asyncio.create_task(record())
    _recording.add(task)
    task.add_done_callback(_recording.discard)


CurrentUser = Annotated[Principal, Depends(principal)]


async def maybe_principal(
    request: Request, keys: KeysDep, settings: SettingsDep, people: PeopleDep, provider: ProviderDep
) -> Principal | None:
    """Who is asking, or None when the request carries no credential at all (a bad one is still a 401)."""
    if not request.headers.get("authorization") and sessions.COOKIE not in request.cookies:
        return None
    return await principal(request, keys, settings, people, provider)


MaybeUser = Annotated[Principal | None, Depends(maybe_principal)]


async def admin_principal(user: CurrentUser) -> Principal:
    if not user.admin:
        raise ApiError(403, "This needs an admin credential.", "admin_required")
    return user


Admin = Annotated[Principal, Depends(admin_principal)]


async def auditor_principal(user: CurrentUser) -> Principal:
    if not user.auditor:
        raise ApiError(403, "This needs the owner or auditor role.", "auditor_required")
    return user


Auditor = Annotated[Principal, Depends(auditor_principal)]
