"""Signing in and out in a browser: OpenID Connect (authorization code with PKCE) against the configured
provider, or a development token exchanged for a session where `dev_tokens` is on; each ends in a server-side
session (api/sessions.py).

The sign-in's state is kept server-side (taken once) and in a short cookie of this browser, so a callback
replayed, forged or carried to another browser is refused; the provider refuses a code used twice.
"""

from __future__ import annotations

import logging
import secrets
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from api import sessions
from api.auth import dev_token
from api.deps import Deps
from api.errors import ApiError
from api.oidc import pkce
from storage.people import Pending, Person

log = logging.getLogger(__name__)
router = APIRouter(include_in_schema=False)


def local_path(value: str | None) -> str:
    """Where to go after signing in: a path of this site only (never another site's address)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


def callback_url(request: Request, deps: Deps) -> str:
    base = deps.settings.public_url.rstrip("/") or str(request.base_url).rstrip("/")
    return f"{base}/auth/callback"


@router.get("/auth/methods")
async def methods(deps: Deps) -> dict[str, Any]:
    """How this install signs people in (the app's sign-in screen shows these)."""
    local = deps.settings.local_accounts_enabled
    return {
        "oidc": deps.provider is not None,
        "dev_tokens": deps.settings.dev_tokens,
        "local": local,
        "needs_owner": local and await deps.people.owner() is None,
    }


@router.get("/auth/login")
async def login(
    request: Request, deps: Deps, return_to: Annotated[str | None, Query()] = None
) -> Response:
    if deps.provider is None:
        raise ApiError(404, "No identity provider is configured here.", "no_identity_provider")
    state, nonce = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    verifier, challenge = pkce()
    await deps.people.pend(state, Pending(verifier, nonce, local_path(return_to)))
    url = await deps.provider.authorize_url(callback_url(request, deps), state, nonce, challenge)
    response = RedirectResponse(url, status_code=302)
    sessions.set_cookie(response, deps.settings, sessions.SIGNIN_COOKIE, state, 600)
    return response


@router.get("/auth/callback")
async def callback(
    request: Request,
    deps: Deps,
    code: Annotated[str | None, Query()] = None,
    state: Annotated[str | None, Query()] = None,
    error: Annotated[str | None, Query()] = None,
) -> Response:
    if deps.provider is None:
        raise ApiError(404, "No identity provider is configured here.", "no_identity_provider")
    if error:
        raise ApiError(
            401, f"The identity provider refused the sign-in ({error}).", "signin_refused"
        )
    mine = request.cookies.get(sessions.SIGNIN_COOKIE, "")
    if not code or not state or not mine or not secrets.compare_digest(mine, state):
        raise ApiError(
            400, "This sign-in was not begun in this browser (state mismatch).", "state_mismatch"
        )
    pending = await deps.people.take(state)
    if pending is None:
        raise ApiError(
            400, "This sign-in has expired or was already used; sign in again.", "state_mismatch"
        )
    tokens = await deps.provider.exchange(
        code, pending.verifier, callback_url(request, deps), pending.nonce
    )
    claims, roles = tokens.claims, deps.settings.role_map
    person = await deps.people.signed_in(
        Person(
            claims["sub"],
            str(claims.get("preferred_username") or claims.get("name") or ""),
            str(claims.get("email") or ""),
            roles.role(claims),
            roles.tier(claims),
            "oidc",
        )
    )
    response = RedirectResponse(pending.return_to, status_code=303)
    sessions.clear_cookie(response, deps.settings, sessions.SIGNIN_COOKIE)
    await sessions.open_session(deps.people, deps.settings, response, person, tokens.refresh)
    return response


class TokenSignIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: str = Field(min_length=1, max_length=4096)


@router.post("/auth/token")
async def token_signin(body: TokenSignIn, deps: Deps) -> Response:
    """A development token (`parley token`, the link `make run` prints) exchanged for a browser session."""
    user = dev_token(body.token.strip(), deps.settings)
    person = await deps.people.signed_in(
        Person(user.user_id, user.user_id, "", user.role, user.tier, "token")
    )
    response = JSONResponse({"user_id": user.user_id, "role": user.role, "tier": user.tier})
    await sessions.open_session(deps.people, deps.settings, response, person)
    return response


@router.post("/auth/logout")
async def logout(
    request: Request, deps: Deps, everywhere: Annotated[bool, Query()] = False
) -> Response:
    """End this session (every session of the person with everywhere=true) on every replica, and the provider's
    session behind it; the answer names the provider's sign-out page, if it has one."""
    session = await sessions.current(request, deps.people, deps.settings, deps.provider)
    if everywhere:
        await deps.people.end_all(session.user_id)
    else:
        await deps.people.end_session(session.user_id, session.session_hash)
    provider_logout = None
    if deps.provider is not None and session.provider == "oidc":
        if session.refresh:
            await deps.provider.revoke(session.refresh)
        provider_logout = await deps.provider.logout_url(str(request.base_url))
    log.info("%s signed out%s", session.user_id, " everywhere" if everywhere else "")
    response = JSONResponse({"signed_out": True, "provider_logout": provider_logout})
    sessions.clear_cookie(response, deps.settings)
    return response
