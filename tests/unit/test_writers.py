"""One writer per table: every store names the one process that writes each of its tables (WRITERS), a store
built for any other process refuses the write before sending it, and docs/structure.md says the same. The
session here only records statements (these tests are of the check, not of Cassandra; the stack tests run
every write on the real cluster, through processes built with their own names)."""

from __future__ import annotations

import asyncio
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from storage.api_keys import ApiKeys
from storage.conversations import Conversations
from storage.decisions import SafetyDecisions
from storage.documents import Documents
from storage.idempotency import IdempotencyKeys
from storage.ledger import Ledger
from storage.memories import Memories
from storage.memory import Memory
from storage.people import People
from storage.preferences import Preferences
from storage.responses import Responses
from storage.retention import Retention
from storage.rows import Change, Message, overlay
from storage.rows import deletions as deleted
from storage.session import WRITE, NotTheWriter
from storage.shares import Shares

ROOT = Path(__file__).resolve().parents[2]
STORES = (
    Conversations,
    Memory,
    ApiKeys,
    SafetyDecisions,
    Ledger,
    IdempotencyKeys,
    People,
    Preferences,
    Shares,
    Memories,
    Retention,
    Responses,
    Documents,
)


class Sent(Exception):
    """The statement reached the session: the check let it through."""


class RecordingSession:
    def __init__(self) -> None:
        self.prepared: list[str] = []
        self.sent: list[Any] = []

    def prepare(self, query: str) -> Any:
        self.prepared.append(query)
        return SimpleNamespace(query=query, is_idempotent=False)

    def execute_async(self, statement: Any, params: Any = None) -> Any:
        self.sent.append(statement)
        raise Sent(getattr(statement, "query", "a batch"))


def documented_writers() -> dict[str, str | tuple[str, ...]]:
    text = (ROOT / "docs" / "structure.md").read_text()
    section = text[text.index("## Tables: which module owns each") : text.index("## Concepts: one home each")]
    rows = re.findall(r"^\| `(\w+)` \| `storage/\w+\.py` \| (\w+(?: and \w+)?) \|$", section, re.MULTILINE)
    return {table: tuple(w.split(" and ")) if " and " in w else w for table, w in rows}


def test_the_map_names_each_tables_one_writer_as_the_stores_do():
    declared: dict[str, str | tuple[str, ...]] = {}
    for store in STORES:
        assert not declared.keys() & store.WRITERS.keys(), f"{store.__name__} declares a table another store owns"
        declared.update(store.WRITERS)
    assert documented_writers() == declared


@pytest.mark.parametrize("store", STORES, ids=lambda s: s.__name__)
def test_every_table_a_store_writes_is_one_it_declares_and_every_declared_table_is_written(store):
    session = RecordingSession()
    store(session, "ks", "nobody")
    written = {m.group(1) for q in session.prepared if (m := WRITE.match(q))}
    assert written == set(store.WRITERS)


def test_a_store_built_for_another_process_refuses_to_write_and_sends_nothing():
    message = Message(str(uuid.uuid1()), "user", "hi", datetime.now(UTC))
    edge = RecordingSession()
    with pytest.raises(NotTheWriter, match="api may not write messages: its one writer is persistence"):
        asyncio.run(Conversations(edge, "ks", "api").put_message(uuid.uuid1(), message))
    with pytest.raises(NotTheWriter, match="api may not write memory"):
        asyncio.run(Memory(edge, "ks", "api").forget(uuid.uuid1(), uuid.uuid1(), 0))
    with pytest.raises(NotTheWriter, match="persistence may not write chats"):
        asyncio.run(Conversations(edge, "ks", "persistence").edit_message(uuid.uuid1(), uuid.uuid1(), None))
    with pytest.raises(NotTheWriter, match="persistence may not write run_fates: its writers are api and scheduling"):
        asyncio.run(Conversations(edge, "ks", "persistence").settle_fate(uuid.uuid1(), uuid.uuid1(), "taken"))
    with pytest.raises(NotTheWriter, match="api may not write budgets"):
        asyncio.run(Ledger(edge, "ks", "api").mark_scheduled("alice", str(uuid.uuid4())))
    assert edge.sent == []
    # The owner's write goes through to the session.
    owner = RecordingSession()
    with pytest.raises(Sent, match="INSERT INTO ks.messages"):
        asyncio.run(Conversations(owner, "ks", "persistence").put_message(uuid.uuid1(), message))
    for writer in ("api", "scheduling"):  # the two sides of the fence, each by compare-and-set
        with pytest.raises(Sent, match="INSERT INTO ks.run_fates .* IF NOT EXISTS"):
            asyncio.run(Conversations(RecordingSession(), "ks", writer).settle_fate(uuid.uuid1(), uuid.uuid1(), "x"))
    with pytest.raises(Sent, match="UPDATE ks.chats SET memory_changed_at"):
        asyncio.run(Conversations(owner, "ks", "api").edit_message(uuid.uuid1(), uuid.uuid1(), "new"))


def test_a_read_lays_the_users_edits_and_deletes_over_the_stored_messages():
    at = datetime.now(UTC)
    rows = [
        Message(str(uuid.uuid1()), role, text, at) for role, text in [("user", "a"), ("assistant", "b"), ("user", "c")]
    ]
    changes = {rows[0].id: Change("A", at), rows[1].id: Change(None, at)}
    seen = overlay(rows, changes)
    assert [(m.id, m.content) for m in seen] == [(rows[0].id, "A"), (rows[2].id, "c")]
    assert rows[0].content == "a"  # the stored row is not changed in place
    assert overlay(rows, {}) == rows
    assert deleted(changes) == 1
