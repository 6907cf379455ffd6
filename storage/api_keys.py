"""API keys in Cassandra: only a SHA-256 of a key is stored (keys are 256-bit random, so a fast hash is enough),
found by its hash when presented and listed per user."""

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


def create_schema(session: Session, keyspace: str) -> None:
    create_tables(session, keyspace, SCHEMA, ())


@dataclass
class ApiKey:
    key_id: str
    name: str
    prefix: str
    tier: str
    created_at: datetime
    revoked_at: datetime | None


class ApiKeys(Store):
    WRITERS = {"api_keys": "api", "api_keys_by_user": "api"}

    def __init__(self, session: Session, keyspace: str, writer: str) -> None:
        super().__init__(session, keyspace, writer)
        ks, p = keyspace, self._prepare
        self._insert_key = p(
            f"INSERT INTO {ks}.api_keys (key_hash, key_id, user_id, tier, revoked) VALUES (?, ?, ?, ?, false)"
        )
        self._insert_key_by_user = p(
            f"INSERT INTO {ks}.api_keys_by_user (user_id, key_id, key_hash, name, prefix, tier, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)"
        )
        self._get_key = p(f"SELECT user_id, tier, revoked FROM {ks}.api_keys WHERE key_hash = ?")
        self._user_keys = p(
            f"SELECT key_id, key_hash, name, prefix, tier, created_at, revoked_at FROM {ks}.api_keys_by_user "
            "WHERE user_id = ?"
        )
        self._revoke_key = p(f"UPDATE {ks}.api_keys SET revoked = true WHERE key_hash = ?")
        self._revoke_key_by_user = p(
            f"UPDATE {ks}.api_keys_by_user SET revoked_at = ? WHERE user_id = ? AND key_id = ?"
        )

    async def create_key(
        self, user_id: str, tier: str, name: str, key_hash: str, prefix: str
    ) -> ApiKey:
        key_id, at = new_id(), now()
        await self._run(self._insert_key, (key_hash, key_id, user_id, tier))
        await self._run(
            self._insert_key_by_user, (user_id, key_id, key_hash, name, prefix, tier, at)
        )
        return ApiKey(str(key_id), name, prefix, tier, at, None)

    async def key_owner(self, key_hash: str) -> tuple[str, str] | None:
        """(user id, tier) of a live key, None when unknown or revoked."""
        row = (await self._run(self._get_key, (key_hash,))).one()
        return None if row is None or row.revoked else (row.user_id, row.tier)

    async def list_keys(self, user_id: str) -> list[ApiKey]:
        return [_key(r) for r in await self._run(self._user_keys, (user_id,))]

    async def revoke_key(self, user_id: str, key_id: uuid.UUID) -> bool:
        rows = [r for r in await self._run(self._user_keys, (user_id,)) if r.key_id == key_id]
        if not rows:
            return False
        await self._run(self._revoke_key, (rows[0].key_hash,))
        if rows[0].revoked_at is None:
            await self._run(self._revoke_key_by_user, (now(), user_id, key_id))
        return True


def _key(row: Any) -> ApiKey:
    revoked = utc(row.revoked_at) if row.revoked_at else None
    return ApiKey(str(row.key_id), row.name, row.prefix, row.tier, utc(row.created_at), revoked)
