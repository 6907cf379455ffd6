"""The schema is the migration's work: a process refuses to start on a keyspace it has not made, and says what
to run; after `python -m storage.schema`'s migrate it starts."""

import dataclasses
import uuid

import pytest

from storage import schema
from storage.api_keys import ApiKeys
from storage.conversations import Conversations
from storage.decisions import SafetyDecisions
from storage.ledger import Ledger
from storage.memory import Memory
from storage.schema import migrate
from storage.session import connect_session


def test_a_process_refuses_an_unmigrated_keyspace_and_starts_after_the_migration(live):
    settings = dataclasses.replace(live.stack.settings.cassandra, keyspace=f"unmigrated_{uuid.uuid4().hex[:8]}")
    with pytest.raises(RuntimeError, match=r"run the migration first .*storage\.schema"):
        schema.connect(settings)
    migrate(settings)
    try:
        session = schema.connect(settings)
        for store in (Conversations, Memory, ApiKeys, SafetyDecisions, Ledger):  # every store's statements prepare
            store(session, settings.keyspace, "api")
        session.cluster.shutdown()
    finally:
        session = connect_session(settings)
        session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=60)
        session.cluster.shutdown()
