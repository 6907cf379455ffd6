"""API keys in Cassandra: only a SHA-256 of a key is stored (keys are 256-bit random, so a fast hash is enough),
found by its hash when presented and listed per user, with the scopes it may be used for, when it expires and
when it was last used. A key made before scopes and expiry were kept has neither: every scope but admin, no end."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cassandra.cluster import Session

from storage.ids import new_id, now, utc
from storage.session import Store, create_tables

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS {ks}.api_keys (
         key_hash text PRIMARY KEY, key_id timeuuid, user_id text, tier text, revoked boolean)""",
    """CREATE TABLE IF NOT EXISTS {ks}.api_keys_by_user (
         user_id text, key_id timeuuid, key_hash text, name text, prefix text, tier text, created_at timestamp,
         revoked_at timestamp, PRIMARY KEY ((user_id), key_id)) WITH CLUSTERING ORDER BY (key_id DESC)""",
)


# Columns added after the tables first shipped: (table, column, type).
COLUMNS_ADDED = (
    ("api_keys", "scopes", "set<text>"),
    ("api_keys", "expires_at", "timestamp"),
    ("api_keys_by_user", "scopes", "set<text>"),
    ("api_keys_by_user", "expires_at", "timestamp"),
    ("api_keys_by_user", "last_used_at", "timestamp"),
)
# what a key made before scopes were kept may do (keys never carried admin)
UNSCOPED = frozenset({"chat", "openai", "usage"})


def create_schema(session: Session, keyspace: str) -> None:
    create_tables(session, keyspace, SCHEMA, COLUMNS_ADDED)


@dataclass
class ApiKey:
    key_id: str
    name: str
    prefix: str
    tier: str
    created_at: datetime
    revoked_at: datetime | None
    scopes: frozenset[str] = UNSCOPED
    expires_at: datetime | None = None
    last_used_at: datetime | None = None


@dataclass(frozen=True)
class KeyOwner:
    """Who a live (unrevoked) key speaks for, and what it may do until when."""

    user_id: str
    tier: str
    key_id: uuid.UUID
    scopes: frozenset[str]
    expires_at: datetime | None


class ApiKeys(Store):
    WRITERS = {"api_keys": "api", "api_keys_by_user": "api"}

    def __init__(self, session: Session, keyspace: str, writer: str) -> None:
        super().__init__(session, keyspace, writer)
        ks, p = keyspace, self._prepare
        self._insert_key = p(
            f"INSERT INTO {ks}.api_keys (key_hash, key_id, user_id, tier, revoked, scopes, expires_at) "
            "VALUES (?, ?, ?, ?, false, ?, ?)"
        )
        self._insert_key_by_user = p(
            f"INSERT INTO {ks}.api_keys_by_user (user_id, key_id, key_hash, name, prefix, tier, created_at, "
            "scopes, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self._get_key = p(
            f"SELECT user_id, tier, revoked, key_id, scopes, expires_at FROM {ks}.api_keys WHERE key_hash = ?"
        )
        self._forget_key = p(f"DELETE FROM {ks}.api_keys WHERE key_hash = ?")
        self._forget_user = p(f"DELETE FROM {ks}.api_keys_by_user WHERE user_id = ?")
        self._user_keys = p(
            f"SELECT key_id, key_hash, name, prefix, tier, created_at, revoked_at, scopes, expires_at, "
            f"last_used_at FROM {ks}.api_keys_by_user WHERE user_id = ?"
        )
        self._used = p(
            f"UPDATE {ks}.api_keys_by_user SET last_used_at = ? WHERE user_id = ? AND key_id = ?"
        )
        self._revoke_key = p(f"UPDATE {ks}.api_keys SET revoked = true WHERE key_hash = ?")
        self._revoke_key_by_user = p(
            f"UPDATE {ks}.api_keys_by_user SET revoked_at = ? WHERE user_id = ? AND key_id = ?"
        )

    async def create_key(
        self,
        user_id: str,
        tier: str,
        name: str,
        key_hash: str,
        prefix: str,
        scopes: frozenset[str] = UNSCOPED,
        expires_at: datetime | None = None,
    ) -> ApiKey:
        key_id, at = new_id(), now()
        await self._run(
            self._insert_key, (key_hash, key_id, user_id, tier, set(scopes), expires_at)
        )
        listed = (user_id, key_id, key_hash, name, prefix, tier, at, set(scopes), expires_at)
        await self._run(self._insert_key_by_user, listed)
        return ApiKey(str(key_id), name, prefix, tier, at, None, scopes, expires_at)

    async def key_owner(self, key_hash: str) -> KeyOwner | None:
        """Who a live key speaks for; None when unknown or revoked (an expired one is the caller's to refuse)."""
        row = (await self._run(self._get_key, (key_hash,))).one()
        if row is None or row.revoked:
            return None
        expires = utc(row.expires_at) if row.expires_at else None
        return KeyOwner(row.user_id, row.tier, row.key_id, _scopes(row.scopes), expires)

    async def used(self, user_id: str, key_id: uuid.UUID) -> None:
        await self._run(self._used, (now(), user_id, key_id))

    async def list_keys(self, user_id: str) -> list[ApiKey]:
        return [_key(r) for r in await self._run(self._user_keys, (user_id,))]

    async def revoke_all(self, user_id: str) -> int:
        """Revoke every live key of the user; how many were live."""
        rows = [r for r in await self._run(self._user_keys, (user_id,)) if r.revoked_at is None]
        for row in rows:
            await self._revoke(user_id, row)
        return len(rows)

    async def forget_all(self, user_id: str) -> int:
        """Delete every key of the user, live or revoked, with its name; how many there were."""
        rows = await self._run(self._user_keys, (user_id,))
        keys = [(self._forget_key, (r.key_hash,)) for r in rows]
        await self._all(*keys, (self._forget_user, (user_id,)))
        return len(keys)

    async def revoke_key(self, user_id: str, key_id: uuid.UUID) -> bool:
        rows = [r for r in await self._run(self._user_keys, (user_id,)) if r.key_id == key_id]
        if not rows:
            return False
        await self._revoke(user_id, rows[0])
        return True

    async def _revoke(self, user_id: str, row: Any) -> None:
        """A key as its owner's listing holds it: refused from now on, and listed as revoked (once)."""
        await self._run(self._revoke_key, (row.key_hash,))
        if row.revoked_at is None:
            await self._run(self._revoke_key_by_user, (now(), user_id, row.key_id))


def _scopes(stored: Any) -> frozenset[str]:
    return frozenset(stored) if stored else UNSCOPED


def _key(row: Any) -> ApiKey:
    def when(value: datetime | None) -> datetime | None:
        return utc(value) if value else None

    return ApiKey(
        str(row.key_id),
        row.name,
        row.prefix,
        row.tier,
        utc(row.created_at),
        when(row.revoked_at),
        _scopes(row.scopes),
        when(row.expires_at),
        when(row.last_used_at),
    )
