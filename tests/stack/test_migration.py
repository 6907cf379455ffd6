"""The schema is the migration's work: a process refuses to start on a keyspace it has not made, and says what
to run; after `python -m storage.schema`'s migrate it starts."""

import dataclasses
import uuid

import pytest

from storage.cassandra import Conversations, connect_session
from storage.ledger import Ledger
from storage.schema import migrate


def test_a_process_refuses_an_unmigrated_keyspace_and_starts_after_the_migration(live):
    settings = dataclasses.replace(live.stack.settings.cassandra, keyspace=f"unmigrated_{uuid.uuid4().hex[:8]}")
    with pytest.raises(RuntimeError, match=r"run the migration first .*storage\.schema"):
        Conversations.connect(settings)
    migrate(settings)
    try:
        conversations = Conversations.connect(settings)
        Ledger(conversations.session, settings.keyspace)  # its table is there too: statements prepare
        conversations.close()
    finally:
        session = connect_session(settings)
        session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=60)
        session.cluster.shutdown()
