"""Shared snapshots of a chat: a branch as it stood when its owner shared it, read by an unguessable id. A share is
its own copy (later messages, edits and deletes do not reach it) until its owner revokes it or deletes the chat;
then it is gone. Listed per owner, newest first."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cassandra.cluster import Session

from storage.at_rest import opened, seal
from storage.ids import utc
from storage.session import Store, create_tables

SCHEMA = (
    # messages: the branch as JSON, root first ([{"role", "content", "created_at", "model"}])
    """CREATE TABLE IF NOT EXISTS {ks}.shares (
         share_id text PRIMARY KEY, chat_id timeuuid, owner text, title text, messages text, public boolean,
         created_at timestamp)""",
    """CREATE TABLE IF NOT EXISTS {ks}.shares_by_owner (
         owner text, created_at timestamp, share_id text, chat_id timeuuid, title text, public boolean,
         PRIMARY KEY ((owner), created_at, share_id)) WITH CLUSTERING ORDER BY (created_at DESC, share_id ASC)""",
)


def create_schema(session: Session, keyspace: str) -> None:
    create_tables(session, keyspace, SCHEMA, ())


@dataclass(frozen=True)
class Share:
    share_id: str
    chat_id: uuid.UUID
    owner: str
    title: str
    public: bool
    created_at: datetime
    messages: list[dict[str, Any]] | None = None  # read with the share itself, not in a listing


class Shares(Store):
    WRITERS = {"shares": "api", "shares_by_owner": "api"}

    def __init__(self, session: Session, keyspace: str, writer: str) -> None:
        super().__init__(session, keyspace, writer)
        ks, p = keyspace, self._prepare
        self._put = p(
            f"INSERT INTO {ks}.shares (share_id, chat_id, owner, title, messages, public, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)"
        )
        self._list_put = p(
            f"INSERT INTO {ks}.shares_by_owner (owner, created_at, share_id, chat_id, title, public) "
            "VALUES (?, ?, ?, ?, ?, ?)"
        )
        self._get = p(f"SELECT * FROM {ks}.shares WHERE share_id = ?")
        self._list = p(f"SELECT * FROM {ks}.shares_by_owner WHERE owner = ?")
        self._delete = p(f"DELETE FROM {ks}.shares WHERE share_id = ?")
        self._unlist = p(
            f"DELETE FROM {ks}.shares_by_owner WHERE owner = ? AND created_at = ? AND share_id = ?"
        )

    async def put(self, share: Share) -> None:
        """The snapshot first, then its listing: a share cut short is readable but not listed (a second
        share of the chat lists again); never listed and unreadable."""
        at, body = share.created_at, seal(share.owner, json.dumps(share.messages or []))
        title = seal(share.owner, share.title)  # sealed with the owner's key (storage/at_rest.py)
        row = (share.share_id, share.chat_id, share.owner, title, body, share.public, at)
        await self._run(self._put, row)
        listed = (share.owner, at, share.share_id, share.chat_id, title, share.public)
        await self._run(self._list_put, listed)

    async def get(self, share_id: str) -> Share | None:
        row = (await self._run(self._get, (share_id,))).one()
        if row is None:
            return None
        return Share(
            row.share_id,
            row.chat_id,
            row.owner,
            opened(row.title),
            bool(row.public),
            utc(row.created_at),
            json.loads(opened(row.messages) or "[]"),
        )

    async def of_owner(self, owner: str) -> list[Share]:
        rows = await self._run(self._list, (owner,))
        return [
            Share(
                r.share_id, r.chat_id, r.owner, opened(r.title), bool(r.public), utc(r.created_at)
            )
            for r in rows
        ]

    async def revoke(self, share: Share) -> None:
        """Unreadable first (404 from then on), then unlisted."""
        await self._run(self._delete, (share.share_id,))
        await self._run(self._unlist, (share.owner, share.created_at, share.share_id))

    async def revoke_chat(self, owner: str, chat_id: uuid.UUID) -> int:
        """Every share of a chat (the chat is being deleted); how many there were."""
        found = [s for s in await self.of_owner(owner) if s.chat_id == chat_id]
        for share in found:
            await self.revoke(share)
        return len(found)
