"""The stores' schemas, applied from one client before the processes start (the stack's "schema" step, the
compose `migrate` service, the chart's migration Job: `python -m storage.schema [--topics]`), with
`--topics` every Kafka topic first: the Cassandra keyspace with
its replication and every table, then a wait until every node agrees; and a ClickHouse server's usage tables
and rollups. Processes run no DDL at start-up (many clients creating the same tables on different nodes at
once can leave the nodes disagreeing) and refuse to start, saying so, when the migration has not run."""

from __future__ import annotations

import argparse
import logging

from storage import ledger
from storage.cassandra import Conversations, agree, connect_session
from topics import logs
from topics.settings import CassandraSettings, StackSettings

log = logging.getLogger("parley.migrate")


def migrate(settings: CassandraSettings) -> None:
    session = connect_session(settings)
    try:
        Conversations.create_schema(session, settings)
        ledger.create_schema(session, settings.keyspace)
        agree(session)
    finally:
        session.cluster.shutdown()
    log.info("cassandra: keyspace %s and its tables are in place", settings.keyspace)


def migrate_usage(settings: StackSettings) -> None:
    """A ClickHouse server's usage tables (the embedded engine's are made by the one process that opens it)."""
    if settings.usage_target.startswith("chdb://"):
        log.info("usage: embedded engine, its tables are made by the metering stage")
        return
    settings.open_usage(create=True).backend.close()
    log.info("usage: database %s and its tables are in place", settings.usage_db)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m storage.schema", description=__doc__)
    parser.add_argument("--topics", action="store_true", help="declare every topic and dead-letter topic first")
    args = parser.parse_args()
    settings = StackSettings()
    logs.configure(settings.log_level, settings.log_format)
    if args.topics:
        from topics.kafka import ensure_topics

        ensure_topics(settings.kafka_bootstrap, settings.namespace, settings.layout)
        log.info("kafka: every topic of namespace %r is declared", settings.namespace)
    migrate(settings.cassandra)
    migrate_usage(settings)


if __name__ == "__main__":
    main()
