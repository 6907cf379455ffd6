"""The Responses API's stored responses: what a response was asked (its whole input and settings), whose it is
and where its records are. Its output is not copied here: the run's records on its reply partition are the
answer, read back by any replica (api/routes/responses.py). Kept 30 days, as OpenAI keeps a stored response;
`previous_response_id` chains onto one within that time. Its input and settings are sealed with the asker's key
(storage/at_rest.py)."""

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
    # messages: the conversation the run was given (ChatMessage JSON); request: the settings a response shows
    """CREATE TABLE IF NOT EXISTS {ks}.responses (
         response_id uuid PRIMARY KEY, user_id text, conversation uuid, reply_partition int, model text,
         messages text, request text, background boolean, created_at timestamp)""",
    # a person's stored responses, so erasing them finds every one (kept as long as the responses)
    """CREATE TABLE IF NOT EXISTS {ks}.responses_by_user (
         user_id text, response_id uuid, PRIMARY KEY (user_id, response_id))""",
)


def create_schema(session: Session, keyspace: str) -> None:
    create_tables(session, keyspace, SCHEMA, ())


@dataclass(frozen=True)
class StoredResponse:
    response_id: uuid.UUID  # the run's id
    user_id: str
    conversation: uuid.UUID  # the run's chat key (api/routes/openai.py conversation_key)
    reply_partition: int
    model: str
    messages: list[dict[str, Any]]
    request: dict[str, Any]
    background: bool
    created_at: datetime


class Responses(Store):
    WRITERS = {"responses": "api", "responses_by_user": "api"}

    def __init__(self, session: Session, keyspace: str, writer: str) -> None:
        super().__init__(session, keyspace, writer)
        ks, p = keyspace, self._prepare
        self._put = p(
            f"INSERT INTO {ks}.responses (response_id, user_id, conversation, reply_partition, model, "
            "messages, request, background, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self._get = p(f"SELECT * FROM {ks}.responses WHERE response_id = ?")
        self._delete = p(f"DELETE FROM {ks}.responses WHERE response_id = ?")
        self._index = p(f"INSERT INTO {ks}.responses_by_user (user_id, response_id) VALUES (?, ?)")
        self._of = p(f"SELECT response_id FROM {ks}.responses_by_user WHERE user_id = ?")
        self._unindex = p(f"DELETE FROM {ks}.responses_by_user WHERE user_id = ?")

    async def put(self, r: StoredResponse) -> None:
        row = (
            r.response_id,
            r.user_id,
            r.conversation,
            r.reply_partition,
            r.model,
            seal(r.user_id, json.dumps(r.messages)),
            seal(r.user_id, json.dumps(r.request)),
            r.background,
            r.created_at,
        )
        await self._run(self._index, (r.user_id, r.response_id))
        await self._run(self._put, row)

    async def get(self, response_id: uuid.UUID) -> StoredResponse | None:
        row = (await self._run(self._get, (response_id,))).one()
        if row is None:
            return None
        return StoredResponse(
            row.response_id,
            row.user_id,
            row.conversation,
            row.reply_partition,
            row.model,
            _json(opened(row.messages), []),
            _json(opened(row.request), {}),
            bool(row.background),
            utc(row.created_at),
        )

    async def delete(self, response_id: uuid.UUID) -> None:
        await self._run(self._delete, (response_id,))

    async def forget_person(self, user_id: str) -> int:
        """Delete every stored response of a person (erasure); how many there were."""
        found = [row.response_id for row in await self._run(self._of, (user_id,))]
        for response_id in found:
            await self._run(self._delete, (response_id,))
        await self._run(self._unindex, (user_id,))
        return len(found)


def _json(text: str, erased: Any) -> Any:
    return json.loads(text) if text else erased  # empty: its owner is erased
