"""Who signs in: the people directory, their server-side browser sessions, and sign-ins under way.

A session is found by (person, SHA-256 of its secret): the cookie carries the person's id and the secret, the
store only the hash, so the table leaks no usable session. Every session of a person is one partition, so
ending all of them (sign-out everywhere, an admin ending a person's access) is one delete. A session row
lives at most `max_s` (its TTL); it is checked against the identity provider every few minutes (api/sessions.py).

A sign-in under way (OpenID Connect state, nonce and PKCE verifier) is one row kept ten minutes and taken once
by compare-and-set, so a callback replayed with the same state is refused on every replica.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cassandra.cluster import Session

from storage.ids import now, utc
from storage.session import Store, create_tables

PENDING_TTL_S = 600
FAILURE_WINDOW_S = 900  # a local account's failed sign-ins count this long

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS {ks}.people (
         user_id text PRIMARY KEY, name text, email text, role text, tier text, source text, disabled boolean,
         created_at timestamp, last_seen timestamp)""",
    # provider: oidc | token (a development token exchanged for a session) | local; refresh: the provider's
    # refresh token, used to check the person is still allowed
    """CREATE TABLE IF NOT EXISTS {ks}.web_sessions (
         user_id text, session_hash text, role text, tier text, csrf text, provider text, refresh text,
         created_at timestamp, checked_at timestamp, PRIMARY KEY ((user_id), session_hash))""",
    # local accounts (installs without an identity provider): an argon2id hash of each password; `owner` has one
    # row, claimed by compare-and-set by the first account made
    """CREATE TABLE IF NOT EXISTS {ks}.local_accounts (
         username text PRIMARY KEY, password_hash text, created_at timestamp)""",
    """CREATE TABLE IF NOT EXISTS {ks}.install_owner (k text PRIMARY KEY, user_id text)""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.signin_failures (
         username text, at timeuuid, PRIMARY KEY ((username), at)) WITH default_time_to_live = {FAILURE_WINDOW_S}""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.signins_pending (
         state text PRIMARY KEY, verifier text, nonce text, return_to text)
         WITH default_time_to_live = {PENDING_TTL_S}""",
)


def create_schema(session: Session, keyspace: str) -> None:
    create_tables(session, keyspace, SCHEMA, ())


@dataclass(frozen=True)
class Person:
    user_id: str
    name: str
    email: str
    role: str
    tier: str
    source: str
    disabled: bool = False
    created_at: datetime | None = None
    last_seen: datetime | None = None


@dataclass(frozen=True)
class WebSession:
    user_id: str
    session_hash: str
    role: str
    tier: str
    csrf: str
    provider: str
    refresh: str | None
    created_at: datetime
    checked_at: datetime


@dataclass(frozen=True)
class Pending:
    verifier: str
    nonce: str
    return_to: str
    extra: dict[str, Any] = field(default_factory=dict)


class People(Store):
    WRITERS = {
        "people": "api",
        "web_sessions": "api",
        "signins_pending": "api",
        "local_accounts": "api",
        "install_owner": "api",
        "signin_failures": "api",
    }

    def __init__(self, session: Session, keyspace: str, writer: str) -> None:
        super().__init__(session, keyspace, writer)
        ks, p = keyspace, self._prepare
        self._upsert_person = p(
            f"UPDATE {ks}.people SET name = ?, email = ?, role = ?, tier = ?, source = ?, last_seen = ? "
            "WHERE user_id = ?"
        )
        self._first_seen = p(
            f"INSERT INTO {ks}.people (user_id, created_at, disabled) VALUES (?, ?, false) IF NOT EXISTS"
        )
        self._get_person = p(f"SELECT * FROM {ks}.people WHERE user_id = ?")
        self._all_people = p(f"SELECT * FROM {ks}.people")
        self._disable = p(f"UPDATE {ks}.people SET disabled = ? WHERE user_id = ? IF EXISTS")
        self._seen = p(f"UPDATE {ks}.people SET last_seen = ? WHERE user_id = ?")
        ttl = "USING TTL ?"
        self._open = p(
            f"INSERT INTO {ks}.web_sessions (user_id, session_hash, role, tier, csrf, provider, refresh, "
            f"created_at, checked_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) {ttl}"
        )
        self._get = p(f"SELECT * FROM {ks}.web_sessions WHERE user_id = ? AND session_hash = ?")
        self._renew = p(
            f"UPDATE {ks}.web_sessions {ttl} SET role = ?, tier = ?, refresh = ?, checked_at = ? "
            "WHERE user_id = ? AND session_hash = ? IF EXISTS"
        )
        self._end = p(f"DELETE FROM {ks}.web_sessions WHERE user_id = ? AND session_hash = ?")
        self._end_all = p(f"DELETE FROM {ks}.web_sessions WHERE user_id = ?")
        self._forget = p(f"DELETE FROM {ks}.people WHERE user_id = ?")
        self._forget_account = p(f"DELETE FROM {ks}.local_accounts WHERE username = ?")
        self._count = p(f"SELECT count(*) FROM {ks}.web_sessions WHERE user_id = ?")
        self._pend = p(
            f"INSERT INTO {ks}.signins_pending (state, verifier, nonce, return_to) VALUES (?, ?, ?, ?)"
        )
        self._take = p(f"DELETE FROM {ks}.signins_pending WHERE state = ? IF EXISTS")
        self._peek = p(
            f"SELECT verifier, nonce, return_to FROM {ks}.signins_pending WHERE state = ?"
        )
        self._new_account = p(
            f"INSERT INTO {ks}.local_accounts (username, password_hash, created_at) VALUES (?, ?, ?) "
            "IF NOT EXISTS"
        )
        self._account = p(f"SELECT password_hash FROM {ks}.local_accounts WHERE username = ?")
        self._rehash = p(f"UPDATE {ks}.local_accounts SET password_hash = ? WHERE username = ?")
        self._claim_owner = p(
            f"INSERT INTO {ks}.install_owner (k, user_id) VALUES ('owner', ?) IF NOT EXISTS"
        )
        self._owner = p(f"SELECT user_id FROM {ks}.install_owner WHERE k = 'owner'")
        self._failed = p(f"INSERT INTO {ks}.signin_failures (username, at) VALUES (?, now())")
        self._failures = p(f"SELECT count(*) FROM {ks}.signin_failures WHERE username = ?")
        self._cleared = p(f"DELETE FROM {ks}.signin_failures WHERE username = ?")

    # -- people ---------------------------------------------------------------------------------------------

    async def signed_in(self, person: Person) -> Person:
        """Record a sign-in (the provider's name, email, and the role and tier its groups map to); the stored
        person, with whether an admin has disabled them here."""
        at = now()
        await self._run(self._first_seen, (person.user_id, at))
        values = (person.name, person.email, person.role, person.tier, person.source, at)
        await self._run(self._upsert_person, (*values, person.user_id))
        found = await self.person(person.user_id)
        assert found is not None
        return found

    async def person(self, user_id: str) -> Person | None:
        row = (await self._run(self._get_person, (user_id,))).one()
        return _person(row) if row else None

    async def everyone(self) -> list[Person]:
        return sorted(
            (_person(r) for r in await self._run(self._all_people, ()) if r.role),
            key=lambda p: p.user_id,
        )

    async def set_disabled(self, user_id: str, disabled: bool) -> bool:
        return bool((await self._run(self._disable, (disabled, user_id))).one()[0])

    async def seen(self, user_id: str) -> None:
        await self._run(self._seen, (now(), user_id))

    # -- sessions -------------------------------------------------------------------------------------------

    async def open_session(self, s: WebSession, max_s: int) -> None:
        values = (s.user_id, s.session_hash, s.role, s.tier, s.csrf, s.provider, s.refresh)
        await self._run(self._open, (*values, s.created_at, s.checked_at, max_s))

    async def find_session(self, user_id: str, session_hash: str) -> WebSession | None:
        row = (await self._run(self._get, (user_id, session_hash))).one()
        if row is None:
            return None
        return WebSession(
            row.user_id,
            row.session_hash,
            row.role,
            row.tier,
            row.csrf,
            row.provider,
            row.refresh,
            utc(row.created_at),
            utc(row.checked_at),
        )

    async def renew(self, s: WebSession, ttl_s: int) -> bool:
        """The session checked again now (the provider's new refresh token, role and tier); False when it
        ended meanwhile."""
        values = (ttl_s, s.role, s.tier, s.refresh, now(), s.user_id, s.session_hash)
        return bool((await self._run(self._renew, values)).one()[0])

    async def end_session(self, user_id: str, session_hash: str) -> None:
        await self._run(self._end, (user_id, session_hash))

    async def end_all(self, user_id: str) -> int:
        """End every session of the person; how many there were."""
        count = (await self._run(self._count, (user_id,))).one()[0]
        await self._run(self._end_all, (user_id,))
        return int(count)

    async def forget(self, person: Person) -> None:
        """The person's row and, for a local account, its password: the person is gone from the directory
        (their sessions are ended first, end_all)."""
        if person.source == "local":
            await self._run(self._forget_account, (person.user_id,))
        await self._run(self._forget, (person.user_id,))

    # -- sign-ins under way ---------------------------------------------------------------------------------

    async def pend(self, state: str, pending: Pending) -> None:
        await self._run(self._pend, (state, pending.verifier, pending.nonce, pending.return_to))

    async def take(self, state: str) -> Pending | None:
        """The sign-in this state began, once: a second take of the same state finds nothing."""
        row = (await self._run(self._peek, (state,))).one()
        if row is None or not (await self._run(self._take, (state,))).one()[0]:
            return None
        return Pending(row.verifier, row.nonce, row.return_to)

    # -- local accounts -------------------------------------------------------------------------------------

    async def new_account(self, username: str, password_hash: str) -> bool:
        """False when the name is taken."""
        row = (await self._run(self._new_account, (username, password_hash, now()))).one()
        return bool(row[0])

    async def password_hash(self, username: str) -> str | None:
        row = (await self._run(self._account, (username,))).one()
        return str(row.password_hash) if row else None

    async def rehash(self, username: str, password_hash: str) -> None:
        await self._run(self._rehash, (password_hash, username))

    async def failures(self, username: str) -> int:
        """Failed sign-ins of the name in the last FAILURE_WINDOW_S, on every replica."""
        return int((await self._run(self._failures, (username,))).one()[0])

    async def failed(self, username: str) -> None:
        await self._run(self._failed, (username,))

    async def cleared(self, username: str) -> None:
        await self._run(self._cleared, (username,))

    async def claim_owner(self, user_id: str) -> bool:
        """True for the one first account of the install (compare-and-set: one of two at once wins)."""
        return bool((await self._run(self._claim_owner, (user_id,))).one()[0])

    async def owner(self) -> str | None:
        row = (await self._run(self._owner, ())).one()
        return str(row.user_id) if row else None


def _person(row: Any) -> Person:
    return Person(
        row.user_id,
        row.name or "",
        row.email or "",
        row.role or "member",
        row.tier or "free",
        row.source or "",
        bool(row.disabled),
        utc(row.created_at) if row.created_at else None,
        utc(row.last_seen) if row.last_seen else None,
    )
