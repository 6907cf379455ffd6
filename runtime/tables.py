"""Small keyed topics read whole by every replica that needs them: the latest record per key, followed live.

A table topic (limits, pool status) is tiny and changes rarely or is overwritten often; each reader assigns
every partition itself (no consumer group, nothing committed) and keeps the rows in memory.
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from runtime.kafka import ConsumerThread, consumer_config, until_ready
from topics import codec
from topics.codec import Event
from topics.errors import PoisonEvent
from topics.pipeline import Topic, check_consume, named

log = logging.getLogger(__name__)


class TopicTable:
    def __init__(
        self,
        bootstrap: str,
        topic: Topic[Any],
        namespace: str,
        reader: str,
        *,
        since_s: float | None = None,
    ) -> None:
        """reader: the stage whose process keeps the view (a declared consumer of the topic); since_s: read only
        the last seconds of the topic (status that goes stale); None: the whole topic."""
        check_consume(reader, topic)
        self.topic = topic
        self.name = named(topic, namespace)
        self.since_s = since_s
        self._bootstrap = bootstrap
        self._ends: Consumer | None = None
        self._asking = threading.Lock()
        self._consumer = Consumer(
            consumer_config(
                bootstrap,
                f"{namespace or 'parley'}.table-reader",
                **{"enable.partition.eof": False},
            )
        )
        self._rows: dict[str, Event] = {}
        self._reader = ConsumerThread(self._consumer, f"table-{topic.schema}", self._poll)
        self._caught_up = threading.Event()
        self._pending: dict[int, int] = {}  # partition -> its end at start, until read that far
        self._partitions: list[int] = []
        self._read = threading.Condition()
        self._next: dict[int, int] = {}  # partition -> the offset after the last record read

    def start(self, timeout_s: float = 30.0) -> None:
        """Assign every partition and return once the rows present at start have been read."""
        metadata = until_ready(
            f"table {self.name}", lambda: self._consumer.list_topics(self.name, timeout=10)
        )
        partitions = self._partitions = sorted(metadata.topics[self.name].partitions)
        since_ms = int((time.time() - self.since_s) * 1000) if self.since_s is not None else None
        assignment = []
        for p in partitions:
            ends = partial(
                self._consumer.get_watermark_offsets, TopicPartition(self.name, p), timeout=10
            )
            low, high = until_ready(f"table {self.name}", ends)
            start = low
            if since_ms is not None:
                at = partial(
                    self._consumer.offsets_for_times,
                    [TopicPartition(self.name, p, since_ms)],
                    timeout=10,
                )
                found = until_ready(f"table {self.name}", at)[0]
                start = found.offset if found.offset >= 0 else high
            self._next[p] = start
            if start < high:
                self._pending[p] = high  # caught up once the record before `high` has been read
            assignment.append(TopicPartition(self.name, p, start))
        if not self._pending:
            self._caught_up.set()
        self._reader.start(assignment)
        if not self._caught_up.wait(timeout_s):
            log.warning(
                "table %s: not caught up after %.0fs; going on with what was read",
                self.name,
                timeout_s,
            )

    def _poll(self) -> None:
        msg = self._consumer.poll(0.1)
        if msg is None or msg.error() is not None:
            return
        key = (msg.key() or b"").decode(errors="replace")
        value = msg.value()
        record: Event | None = None
        if value:
            try:
                record = codec.decode(self.topic.schema, value)
            except PoisonEvent as exc:
                log.warning("table %s: skipping undecodable row %r: %s", self.name, key, exc)
                record = self._rows.get(key)  # keep what we had
        self._apply(key, record)
        partition, offset = msg.partition() or 0, msg.offset() or 0
        with self._read:
            self._next[partition] = offset + 1
            self._read.notify_all()
        if partition in self._pending and offset + 1 >= self._pending[partition]:
            del self._pending[partition]
            if not self._pending:
                self._caught_up.set()

    def _apply(self, key: str, record: Event | None) -> None:
        if record is None:
            self._rows.pop(key, None)  # a tombstone
        else:
            self._rows[key] = record

    def catch_up(self, timeout_s: float = 30.0) -> bool:
        """Wait until every record written before this call has been read (False: not within timeout_s)."""
        ends = {}
        with self._asking:
            if self._ends is None:  # its own client: the reader's is busy polling on its thread
                self._ends = Consumer(consumer_config(self._bootstrap, f"{self.name}.ends"))
            for p in self._partitions:
                at = partial(
                    self._ends.get_watermark_offsets, TopicPartition(self.name, p), timeout=5
                )
                ends[p] = until_ready(f"table {self.name}", at, timeout_s)[1]
        with self._read:
            return self._read.wait_for(
                lambda: all(self._next.get(p, 0) >= end for p, end in ends.items()), timeout_s
            )

    def rows(self) -> dict[str, Event]:
        return dict(self._rows)

    def get(self, key: str) -> Event | None:
        return self._rows.get(key)

    def stop(self) -> None:
        self._reader.stop()
        if self._ends is not None:
            self._ends.close()
