"""What the retention sweep reads (api/retention.py): the people who have chats, the ones who chose to have
their chats deleted after some days, and a person's chats untouched since a time; and the lease that lets one
edge replica sweep at a time (a lightweight transaction whose row expires with the interval). The chats
themselves are deleted as a person deletes one (api/chat_state.py erase_chat), by their tables' writers."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime
from typing import Any

from cassandra.cluster import Session

from storage.ids import now
from storage.session import Store, create_tables

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS {ks}.retention_lease (
         name text PRIMARY KEY, holder text, taken_at timestamp)""",
)


def create_schema(session: Session, keyspace: str) -> None:
    create_tables(session, keyspace, SCHEMA, ())


class Retention(Store):
    WRITERS = {"retention_lease": "api"}

    def __init__(self, session: Session, keyspace: str, writer: str) -> None:
        super().__init__(session, keyspace, writer)
        ks, p = keyspace, self._prepare
        self._people = p(f"SELECT DISTINCT user_id FROM {ks}.chats_by_activity")
        self._chosen = p(f"SELECT user_id, delete_after_days FROM {ks}.person_settings")
        self._older = p(
            f"SELECT chat_id FROM {ks}.chats_by_activity WHERE user_id = ? AND active_at < ?"
        )
        self._take = p(
            f"INSERT INTO {ks}.retention_lease (name, holder, taken_at) VALUES ('sweep', ?, ?) "
            "IF NOT EXISTS USING TTL ?"
        )

    async def _scan(self, statement: Any, params: tuple[Any, ...] = ()) -> list[Any]:
        """Every row, page after page (a thread: the driver fetches the later pages as they are iterated)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            None, lambda: list(self.session.execute(statement, params, timeout=60))
        )

    async def people(self) -> list[str]:
        """Everyone with a chat."""
        return [r.user_id for r in await self._scan(self._people)]

    async def chosen(self) -> dict[str, int]:
        """The people who chose to have their chats deleted after some days, and how many."""
        rows = await self._scan(self._chosen)
        return {r.user_id: r.delete_after_days for r in rows if r.delete_after_days}

    async def older(self, user_id: str, before: datetime) -> list[uuid.UUID]:
        """The person's chats whose activity row is older than `before` (a row may be stale: the caller
        checks the chat's own time)."""
        rows = await self._scan(self._older, (user_id, before))
        return list(dict.fromkeys(r.chat_id for r in rows))

    async def take_lease(self, holder: str, seconds: int) -> bool:
        """Whether this replica sweeps now: the first to ask in each interval does."""
        row = (await self._run(self._take, (holder, now(), seconds))).one()
        return bool(row[0])
