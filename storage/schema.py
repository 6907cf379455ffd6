"""The stores' schemas, applied from one client before the processes start (the stack's "schema" step, the
compose `migrate` service, the chart's migration Job: `python -m storage.schema [--topics]`), with
`--topics` every Kafka topic first: the Cassandra keyspace with
its replication and every table, then a wait until every node agrees; and a ClickHouse server's usage tables
and rollups. Processes run no DDL at start-up (many clients creating the same tables on different nodes at
once can leave the nodes disagreeing) and refuse to start, saying so, when the migration has not run."""

from __future__ import annotations

import argparse
import logging
import re

from cassandra.cluster import Session

from runtime import logs
from runtime.settings import CassandraSettings, StackSettings
from storage import (
    api_keys,
    conversations,
    decisions,
    documents,
    idempotency,
    ledger,
    memories,
    memory,
    people,
    preferences,
    responses,
    retention,
    shares,
)
from storage.session import agree, connect_session, ensure_keyspace
from storage.usage import open_usage

log = logging.getLogger("parley.migrate")

# Each store owns its tables (their DDL is in its module): chats, runs and messages; a chat's memory; API keys;
# safety decisions; the budget ledger; idempotency keys; people and their browser sessions; what a person sets
# for their chats; shared snapshots; what a person asked Parley to remember.
STORES = (
    conversations,
    memory,
    api_keys,
    decisions,
    ledger,
    idempotency,
    people,
    preferences,
    shares,
    memories,
    retention,
    responses,
    documents,
)


# The tables whose rows expire a period after they are written (runtime/settings.py Periods): the migration
# gives each the period as its default_time_to_live. A changed period applies to rows written after the change;
# a row keeps the TTL it was written with (docs/privacy.md).
EXPIRING = {
    "safety_decisions": "safety",
    "responses": "responses",
    "responses_by_user": "responses",
}


def expire_by_period(session: Session, settings: CassandraSettings) -> dict[str, int]:
    """Give each expiring table its period where its TTL differs; returns {table: seconds} of those changed."""
    changed = {}
    for table, kind in EXPIRING.items():
        wanted = settings.periods.seconds(kind)
        row = session.execute(
            "SELECT default_time_to_live FROM system_schema.tables "
            "WHERE keyspace_name = %s AND table_name = %s",
            (settings.keyspace, table),
            timeout=60,
        ).one()
        if row.default_time_to_live != wanted:
            session.execute(
                f"ALTER TABLE {settings.keyspace}.{table} WITH default_time_to_live = {wanted}",
                timeout=60,
            )
            changed[table] = wanted
            log.info("cassandra: %s rows now expire %d s after they are written", table, wanted)
    return changed


def migrate(settings: CassandraSettings) -> None:
    session = connect_session(settings)
    try:
        ensure_keyspace(session, settings)
        # The driver waits 10 s for the nodes to agree after each DDL statement and then goes on regardless: on a
        # busy 3-node cluster the first CREATE TABLE then reached a node that had not seen the keyspace yet.
        agree(session)
        for store in STORES:
            store.create_schema(session, settings.keyspace)
        expire_by_period(session, settings)
        agree(session)
    finally:
        session.cluster.shutdown()
    log.info("cassandra: keyspace %s and its tables are in place", settings.keyspace)


def tables() -> set[str]:
    """Every table the stores declare."""
    ddl = " ".join(statement for store in STORES for statement in store.SCHEMA)
    return {t.removeprefix("{ks}.") for t in re.findall(r"TABLE IF NOT EXISTS (\S+) \(", ddl)}


def require_schema(session: Session, keyspace: str) -> None:
    """Fail at start-up, saying what to run, when the migration has not made the keyspace and its tables."""
    meta = session.cluster.metadata.keyspaces.get(keyspace)
    missing = sorted(tables() - set(meta.tables)) if meta else sorted(tables())
    if missing:
        raise RuntimeError(
            f"keyspace {keyspace!r} lacks {', '.join(missing)}: run the migration first "
            "(`python -m storage.schema`, the chart's migration Job, or `parley up`)"
        )


def connect(settings: CassandraSettings) -> Session:
    """The session every store of a process shares, on the keyspace the migration made: processes run no DDL
    at start-up, and refuse to start, saying so, without it."""
    session = connect_session(settings)
    try:
        require_schema(session, settings.keyspace)
    except RuntimeError:
        session.cluster.shutdown()
        raise
    return session


def drop_keyspace(settings: CassandraSettings) -> None:
    """Drop a namespace's keyspace (a finished replay's, a benchmark's): every Cassandra node keeps each table's
    structures in its heap for as long as the table exists."""
    session = connect_session(settings)
    try:
        session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=60)
    finally:
        session.cluster.shutdown()


def migrate_usage(settings: StackSettings) -> None:
    """A ClickHouse server's usage tables (the embedded engine's are made by the one process that opens it)."""
    if settings.usage_target.startswith("chdb://"):
        log.info("usage: embedded engine, its tables are made by the metering stage")
        return
    open_usage(settings, create=True).backend.close()
    log.info("usage: database %s and its tables are in place", settings.usage_db)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m storage.schema", description=__doc__)
    parser.add_argument(
        "--topics", action="store_true", help="declare every topic and dead-letter topic first"
    )
    args = parser.parse_args()
    settings = StackSettings()
    logs.configure(settings.log_level, settings.log_format)
    if args.topics:
        from runtime.kafka import ensure_topics

        ensure_topics(settings.kafka_bootstrap, settings.namespace, settings.layout)
        log.info("kafka: every topic of namespace %r is declared", settings.namespace)
    migrate(settings.cassandra)
    migrate_usage(settings)


if __name__ == "__main__":
    main()
