"""The Cassandra session every store shares: how it connects and retries, statements that may run twice,
the bridge from the driver's futures to asyncio, and the schema steps the migration uses
(docs/decisions/0011-replicated-data-plane.md)."""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from cassandra import ConsistencyLevel, InvalidRequest
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    NoHostAvailable,
    ResponseFuture,
    Session,
)
from cassandra.policies import (
    ConstantSpeculativeExecutionPolicy,
    DCAwareRoundRobinPolicy,
    ExponentialReconnectionPolicy,
    RetryPolicy,
    TokenAwarePolicy,
)
from cassandra.query import PreparedStatement

from runtime.settings import CassandraSettings

log = logging.getLogger(__name__)

RECONNECT_MAX_S = 5.0
# a statement's answer takes milliseconds; a second is a node that died or stalls
SPECULATE_AFTER_S = 1.0


async def wait(future: ResponseFuture) -> Any:
    """Bridge the driver's callback future into asyncio."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(rows: Any = None, exc: BaseException | None = None) -> None:
        if done.done():
            return
        if exc is None:
            done.set_result(rows)
        else:
            done.set_exception(exc)

    def ok(rows: Any) -> None:
        loop.call_soon_threadsafe(settle, rows)

    def fail(exc: BaseException) -> None:
        loop.call_soon_threadsafe(settle, None, exc)

    future.add_callbacks(ok, fail)
    await done
    # add_callbacks gives only the first page; the future itself knows the rest.
    return future.result()


class NotTheWriter(RuntimeError):
    """A process wrote a table another process owns (docs/structure.md, "Tables")."""


def check_writer(writers: Mapping[str, str | tuple[str, ...]], table: str, writer: str) -> None:
    """Raise NotTheWriter unless `writer` is the one process `writers` names for `table` (or one of the two a
    compare-and-set table names: both sides of a fence write it, and only by compare-and-set)."""
    allowed = writers[table]
    if isinstance(allowed, tuple):
        if writer not in allowed:
            raise NotTheWriter(
                f"{writer} may not write {table}: its writers are {' and '.join(allowed)}"
            )
    elif writer != allowed:
        raise NotTheWriter(f"{writer} may not write {table}: its one writer is {allowed}")


WRITE = re.compile(r"^\s*(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+\w+\.(\w+)", re.IGNORECASE)


class Store:
    """A store's statements run on the shared session: one at a time (`_run`) or independent ones at once.

    Every table has one writer, a process named in the store's WRITERS; a store is built for the process
    using it (`writer`), and running a write statement on a table that process does not own raises
    NotTheWriter, before anything is sent. The table a statement writes is read from its text."""

    WRITERS: ClassVar[
        Mapping[str, str | tuple[str, ...]]
    ] = {}  # table -> the one process that writes it

    def __init__(self, session: Session, keyspace: str, writer: str) -> None:
        self.session = session
        self.keyspace = keyspace
        self.writer = writer
        self._prepare_idempotent = idempotent(session)
        self._writes: dict[int, str] = {}  # id of a prepared write statement -> its table

    def _prepare(self, query: str) -> PreparedStatement:
        statement = self._prepare_idempotent(query)
        if match := WRITE.match(query):
            table = match.group(1)
            if table not in self.WRITERS:
                raise ValueError(
                    f"{type(self).__name__} writes {table}, which its WRITERS do not name"
                )
            self._writes[id(statement)] = table
        return statement

    def _check(self, statement: Any) -> None:
        table = self._writes.get(id(statement))
        if table is not None:
            check_writer(self.WRITERS, table, self.writer)

    async def _run(self, statement: Any, params: tuple[Any, ...]) -> Any:
        self._check(statement)
        return await wait(self.session.execute_async(statement, params))

    async def _all(self, *items: tuple[Any, tuple[Any, ...]]) -> None:
        """Independent single-partition writes at once. Writes that touch several tables are not logged
        batches: until a killed node is convicted (about 20 s), a coordinator still picks it as a batchlog
        replica and every logged batch times out, while a plain LOCAL_QUORUM write needs only the two live
        copies. Each method orders or pairs its writes so that a failure between them leaves nothing a
        reader shows wrongly (docs/decisions/0011-replicated-data-plane.md), and a retry completes them."""
        for statement, _ in items:
            self._check(statement)  # all refused before any is sent
        await asyncio.gather(*(self._run(statement, params) for statement, params in items))


def create_tables(
    session: Session,
    keyspace: str,
    schema: tuple[str, ...],
    columns: tuple[tuple[str, str, str], ...],
) -> None:
    """A store's tables and the columns added to them since they first shipped: the migration's work."""
    for statement in schema:
        session.execute(statement.format(ks=keyspace), timeout=60)
    add_columns(session, keyspace, columns)


def replication(settings: CassandraSettings) -> dict[str, str]:
    """The keyspace's replication map: a copy count per datacenter (NetworkTopologyStrategy)."""
    return {"class": "org.apache.cassandra.locator.NetworkTopologyStrategy"} | {
        dc: str(copies) for dc, copies in sorted(settings.replication.items())
    }


def ensure_keyspace(session: Session, settings: CassandraSettings) -> None:
    """Create the keyspace with the configured replication, or change an existing keyspace's replication to it
    (Cassandra then needs `nodetool repair` on each node to copy existing rows to their new replicas)."""
    wanted = replication(settings)
    literal = ", ".join(f"'{k}': '{v}'" for k, v in wanted.items())
    session.execute(
        f"CREATE KEYSPACE IF NOT EXISTS {settings.keyspace} WITH replication = {{{literal}}}",
        timeout=60,
    )
    row = session.execute(
        "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = %s",
        (settings.keyspace,),
        timeout=60,
    ).one()
    if row is not None and dict(row.replication) != wanted:
        log.warning(
            "keyspace %s: replication %s -> %s; run a repair",
            settings.keyspace,
            row.replication,
            wanted,
        )
        session.execute(
            f"ALTER KEYSPACE {settings.keyspace} WITH replication = {{{literal}}}", timeout=60
        )


class FailoverRetry(RetryPolicy):  # type: ignore[misc]
    """The driver's retries, except that a coordinator that counts too few live replicas (it has not yet seen a
    node come back) is left for the next host twice, not once."""

    def on_unavailable(self, query: Any, consistency: int, *args: Any, **kwargs: Any) -> Any:
        retry_num = kwargs.get("retry_num", args[-1] if args else 0)
        return (self.RETRY_NEXT_HOST, consistency) if retry_num < 2 else (self.RETHROW, None)


def idempotent(session: Session) -> Callable[[str], PreparedStatement]:
    """`session.prepare` for statements that may run twice with the same effect (every write here sets the
    values it is given, keyed by ids from the event or the request; none is a counter or a compare-and-set).
    The driver sends such a statement again to another replica when the first does not answer (speculative
    execution, `connect_session`), and only such: without it a request caught on the connection of a node that had
    just been killed waited out the 10 s request timeout and failed (the cluster bench's POST /v1/chats)."""

    def prepare(query: str) -> PreparedStatement:
        statement: PreparedStatement = session.prepare(query)
        statement.is_idempotent = True
        return statement

    return prepare


def tls(ca_file: str) -> ssl.SSLContext | None:
    """TLS to every node, its certificate checked against the CA (None: plaintext). The driver connects to
    the addresses the cluster advertises, so the chain is checked rather than each host name: the CA is the
    deployment's own and signs only its nodes."""
    if not ca_file:
        return None
    context = ssl.create_default_context(cafile=ca_file)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def connect_session(settings: CassandraSettings, timeout_s: float = 90.0) -> Session:
    """Connect, retrying while a node that has just started (or is swamped by every stage connecting at once
    on a small machine) does not answer yet. A failed connect shuts its Cluster down, so each try builds one.
    Every statement runs at the configured consistency (LOCAL_QUORUM: a write is acknowledged by a majority of
    the local datacenter's copies, so it survives losing one), compare-and-set at LOCAL_SERIAL. An idempotent
    statement with no answer after SPECULATE_AFTER_S is sent once more, to the next replica in its plan."""
    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(
            DCAwareRoundRobinPolicy(local_dc=settings.datacenter)
        ),
        consistency_level=ConsistencyLevel.name_to_value[settings.consistency],
        serial_consistency_level=ConsistencyLevel.name_to_value[settings.serial_consistency],
        retry_policy=FailoverRetry(),
        request_timeout=10,
        speculative_execution_policy=ConstantSpeculativeExecutionPolicy(
            SPECULATE_AFTER_S, max_attempts=1
        ),
    )
    deadline = time.monotonic() + timeout_s
    while True:
        cluster = Cluster(
            list(settings.hosts),
            port=settings.port,
            connect_timeout=10,
            protocol_version=5,
            execution_profiles={EXEC_PROFILE_DEFAULT: profile},
            # A node that comes back is used again within seconds (the driver's default backs off to 600 s).
            reconnection_policy=ExponentialReconnectionPolicy(
                base_delay=0.5, max_delay=RECONNECT_MAX_S
            ),
            auth_provider=PlainTextAuthProvider(settings.username, settings.password)
            if settings.username
            else None,
            ssl_context=tls(settings.ca_file),
        )
        try:
            return cluster.connect()
        except NoHostAvailable as exc:
            cluster.shutdown()
            if time.monotonic() > deadline:
                raise
            log.info("Cassandra not reachable yet (%s); retrying", exc)
            time.sleep(1.0)


def agree(session: Session, timeout_s: float = 60.0) -> None:
    """Wait until every node has the same schema: a table one node has just created is not yet known to the
    others, and a statement prepared there fails "table ... does not exist"."""
    if not session.cluster.control_connection.wait_for_schema_agreement(wait_time=timeout_s):
        raise RuntimeError(f"Cassandra nodes did not agree on the schema within {timeout_s:.0f}s")


def add_columns(session: Session, keyspace: str, columns: tuple[tuple[str, str, str], ...]) -> None:
    """Add each (table, column, type) a table created by an older release lacks (schema evolution)."""
    # The columns are read with an ordinary query rather than the driver's schema metadata: its refresh
    # runs on the control connection with a short timeout, and failed outright on a node that had just
    # restarted with every stage connecting at once (CI, test_restart).
    for table, column, kind in columns:
        present = session.execute(
            "SELECT column_name FROM system_schema.columns WHERE keyspace_name = %s AND table_name = %s "
            "AND column_name = %s",
            (keyspace, table, column),
            timeout=60,
        ).one()
        if present is None:
            try:
                session.execute(f"ALTER TABLE {keyspace}.{table} ADD {column} {kind}", timeout=60)
            except InvalidRequest as exc:  # another stage starting beside this one added it first
                if (
                    "exist" not in str(exc).lower()
                ):  # "already exists", "conflicts with an existing column"
                    raise
        _usable(session, keyspace, table, column)


def _usable(
    session: Session, keyspace: str, table: str, column: str, timeout_s: float = 30.0
) -> None:
    """Wait until a column just added can be queried: while another stage's ALTER is still being applied, the
    schema tables already list it but a statement naming it fails "Undefined column name"."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            session.execute(f"SELECT {column} FROM {keyspace}.{table} LIMIT 1", timeout=60)
            return
        except InvalidRequest:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
