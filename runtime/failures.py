"""One failure policy for both Kafka clients: the faust stages' shell (processors/stage.py) and the inference
consumers (inference/worker.py). What failed decides what happens to the record:

- a dependency was away (the log, a store, the schema registry; for ClickHouse, a network error or an HTTP
  error still there after the client's own retry): `retry`. The record is handled again, never
  dead-lettered: the faust shell retries in place with backoff (its partition waits); the inference consumer
  leaves the offset uncommitted and the run is read again (by it or, after a rebalance, by another consumer,
  which continues after what the run published).
- anything else (a record that does not decode, or one its handler fails on): `dead_letter`. The record goes
  to `<topic>.dlq` with where it came from and why (runtime/kafka.py `dead_letter`, Stage.dead_letter), its
  offset is committed, and the stage goes on with the next: one bad record never stalls a partition.
"""

from __future__ import annotations

from typing import Literal

from cassandra import OperationTimedOut, ReadTimeout, Unavailable, WriteTimeout
from cassandra.cluster import NoHostAvailable
from clickhouse_connect.driver.exceptions import OperationalError as ClickHouseAway
from confluent_kafka import KafkaException

from topics.errors import RetriableError

# Failures of a dependency, not of the record.
RETRIABLE: tuple[type[BaseException], ...] = (
    RetriableError,
    ConnectionError,
    TimeoutError,
    KafkaException,
    NoHostAvailable,
    OperationTimedOut,
    Unavailable,
    ReadTimeout,
    WriteTimeout,
    ClickHouseAway,
)


def after(exc: BaseException) -> Literal["retry", "dead_letter"]:
    """What a failed record gets (pure)."""
    return "retry" if isinstance(exc, RETRIABLE) else "dead_letter"
