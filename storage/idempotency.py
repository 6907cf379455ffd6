"""Idempotency keys: the first request a client sends with a key claims it (compare-and-set, so one of two at
once wins on every replica), naming what it makes (a chat, or a run and its reply partition); a retry with the
same key finds that claim and is answered with the same chat or run, never a second. A claim lives
`KEY_TTL_S`; one whose request failed before it made anything is released, so a retry runs anew."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cassandra.cluster import Session

from storage.session import Store, create_tables

KEY_TTL_S = 24 * 3600

SCHEMA = (
    # request: a digest of the route and body (the same key with another request is refused); published: the
    # run's prompt reached the log (a retry may read its stream).
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.idempotency_keys (
         user_id text, key text, request text, chat_id text, run_id text, reply_partition int,
         published boolean, PRIMARY KEY ((user_id, key))) WITH default_time_to_live = {KEY_TTL_S}""",
)


def create_schema(session: Session, keyspace: str) -> None:
    create_tables(session, keyspace, SCHEMA, ())


@dataclass(frozen=True)
class Claim:
    request: str
    chat_id: str | None = None
    run_id: str | None = None
    reply_partition: int | None = None
    published: bool = False


class IdempotencyKeys(Store):
    WRITERS = {"idempotency_keys": "api"}

    def __init__(self, session: Session, keyspace: str, writer: str) -> None:
        super().__init__(session, keyspace, writer)
        ks, p = keyspace, self._prepare
        self._claim = p(
            f"INSERT INTO {ks}.idempotency_keys (user_id, key, request, chat_id, run_id, reply_partition, "
            "published) VALUES (?, ?, ?, ?, ?, ?, false) IF NOT EXISTS"
        )
        self._published = p(
            f"UPDATE {ks}.idempotency_keys SET published = true WHERE user_id = ? AND key = ? IF EXISTS"
        )
        self._release = p(
            f"DELETE FROM {ks}.idempotency_keys WHERE user_id = ? AND key = ? IF EXISTS"
        )

    async def claim(self, user_id: str, key: str, claim: Claim) -> Claim | None:
        """None when this request now holds the key; otherwise the claim of the request that holds it."""
        values = (user_id, key, claim.request, claim.chat_id, claim.run_id, claim.reply_partition)
        row = (await self._run(self._claim, values)).one()
        return None if row[0] else _claim(row)

    async def published(self, user_id: str, key: str) -> None:
        await self._run(self._published, (user_id, key))

    async def release(self, user_id: str, key: str) -> None:
        await self._run(self._release, (user_id, key))


def _claim(row: Any) -> Claim:
    return Claim(row.request, row.chat_id, row.run_id, row.reply_partition, bool(row.published))
