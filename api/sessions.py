"""Browser sessions: the chat app, the dashboard and the run inspector are signed in by a server-side session
whose id travels in a Secure, HttpOnly, SameSite=Lax cookie, never by a token the page's script can read.

- The cookie is `<person id, base64url>.<256-bit secret>`; the store keeps the secret's SHA-256 only.
- A request that changes something (any method but GET/HEAD/OPTIONS) made with the cookie must carry the
  session's CSRF token in `X-CSRF-Token` (the app reads it from /v1/me): a page of another site can make the
  browser send the cookie, but it cannot read the token.
- Every `session_check_s` a session is checked again: one from the identity provider is refreshed there, so a
  person disabled or removed at the provider (or whose session there ended) is signed out here within that
  bound, and a change of group applies; a session of a person an admin disabled here is refused at once.
- Sign-out deletes the row: the session ends on every replica at its next request.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import secrets
from datetime import UTC, datetime, timedelta

from fastapi import Request, Response

from api.errors import ApiError
from api.oidc import Provider, Refused
from api.settings import ApiSettings
from storage.people import People, Person, WebSession

log = logging.getLogger(__name__)
COOKIE = "parley_session"
SIGNIN_COOKIE = (
    "parley_signin"  # the state of a sign-in under way, to match the callback to this browser
)
SAFE = {"GET", "HEAD", "OPTIONS"}


def cookie_value(user_id: str, secret: str) -> str:
    return f"{base64.urlsafe_b64encode(user_id.encode()).decode().rstrip('=')}.{secret}"


def parse_cookie(value: str) -> tuple[str, str] | None:
    encoded, _, secret = value.partition(".")
    if not encoded or len(secret) < 32:
        return None
    try:
        user_id = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user_id, secret) if user_id else None


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


async def open_session(
    people: People,
    settings: ApiSettings,
    response: Response,
    person: Person,
    refresh: str | None = None,
) -> WebSession:
    """A session for the person, signed in by their source (oidc, token, local), its cookie set on the
    response; a person an admin disabled here is refused."""
    if person.disabled:
        raise ApiError(403, "Your access here has been disabled by an admin.", "account_disabled")
    secret = secrets.token_urlsafe(32)
    at = datetime.now(UTC)
    user_id, role, tier, provider = person.user_id, person.role, person.tier, person.source
    session = WebSession(
        user_id, digest(secret), role, tier, secrets.token_urlsafe(24), provider, refresh, at, at
    )
    await people.open_session(session, settings.session_max_s)
    set_cookie(response, settings, COOKIE, cookie_value(user_id, secret), settings.session_max_s)
    log.info("session opened for %s (%s, role %s, tier %s)", user_id, provider, role, tier)
    return session


def set_cookie(
    response: Response, settings: ApiSettings, name: str, value: str, max_age: int
) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path="/",
        secure=settings.cookie_secure,
        httponly=True,
        samesite="lax",
    )


def clear_cookie(response: Response, settings: ApiSettings, name: str = COOKIE) -> None:
    response.delete_cookie(
        name, path="/", secure=settings.cookie_secure, httponly=True, samesite="lax"
    )


def ended(message: str = "Your session has ended; sign in again.") -> ApiError:
    return ApiError(
        401, message, "session_ended", headers={"WWW-Authenticate": 'Cookie realm="parley"'}
    )


async def current(
    request: Request, people: People, settings: ApiSettings, provider: Provider | None
) -> WebSession:
    """The request's session, checked (CSRF, and again at the provider when due)."""
    parsed = parse_cookie(request.cookies.get(COOKIE, ""))
    if parsed is None:
        raise ended("The session cookie is not valid; sign in again.")
    user_id, secret = parsed
    session = await people.find_session(user_id, digest(secret))
    if session is None:
        raise ended()
    if request.method not in SAFE:
        sent = request.headers.get("x-csrf-token", "")
        if not sent or not secrets.compare_digest(sent, session.csrf):
            raise ApiError(
                403,
                "This request needs the session's CSRF token in X-CSRF-Token (from /v1/me).",
                "csrf_failed",
            )
    if datetime.now(UTC) - session.checked_at >= timedelta(seconds=settings.session_check_s):
        session = await recheck(session, people, settings, provider)
    return session


async def recheck(
    session: WebSession, people: People, settings: ApiSettings, provider: Provider | None
) -> WebSession:
    """Ask again whether the person may still be here; end the session if not."""
    person = await people.person(session.user_id)
    if person is not None and person.disabled:
        await people.end_all(session.user_id)
        raise ended("Your access has been disabled.")
    role, tier, refresh = session.role, session.tier, session.refresh
    if session.provider == "oidc":
        if provider is None or refresh is None:
            await people.end_session(session.user_id, session.session_hash)
            raise ended()
        try:
            tokens = await provider.refresh(refresh)
        except Refused:
            await people.end_session(session.user_id, session.session_hash)
            log.info(
                "session of %s ended: the identity provider refused to renew it", session.user_id
            )
            raise ended("The identity provider no longer signs you in; sign in again.") from None
        if tokens.claims:
            role, tier = (
                settings.role_map.role(tokens.claims),
                settings.role_map.tier(tokens.claims),
            )
        refresh = tokens.refresh
    renewed = WebSession(
        session.user_id,
        session.session_hash,
        role,
        tier,
        session.csrf,
        session.provider,
        refresh,
        session.created_at,
        datetime.now(UTC),
    )
    left = settings.session_max_s - int((datetime.now(UTC) - session.created_at).total_seconds())
    if left <= 0 or not await people.renew(renewed, left):
        raise ended()
    await people.seen(session.user_id)
    return renewed
