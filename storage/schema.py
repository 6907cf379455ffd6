"""The Cassandra schema, applied from one client before the processes start (the stack's "schema" step, or
`python -m storage.schema` as a deploy job): the keyspace with its replication, every table, and a wait until
every node agrees. Processes still create what is missing when they connect (IF NOT EXISTS), but on a cluster
many clients creating the same tables on different nodes at once can leave the nodes disagreeing."""

from __future__ import annotations

import logging

from storage.cassandra import Conversations
from storage.ledger import Ledger
from topics.settings import CassandraSettings, StackSettings


def migrate(settings: CassandraSettings) -> None:
    conversations = Conversations.connect(settings)
    try:
        Ledger(conversations.session, settings.keyspace)
    finally:
        conversations.close()


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    migrate(StackSettings().cassandra)


if __name__ == "__main__":
    main()
