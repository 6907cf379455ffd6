"""Reading a time window of the log: each partition from the first record at or after a time, never from 0.

Kafka keeps a time index per partition (`offsets_for_times`), so a window costs the records inside it, not the
records before it: finding a run from a year ago in a topic of a billion records reads its minute, not the
billion. What the run inspector (`parley runs show`) and replay (`parley replay`) read the log with.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from runtime.kafka_auth import client_config
from topics import codec
from topics.errors import PoisonEvent
from topics.pipeline import Topic, named

Key = tuple[str, int]  # (topic name on the broker, partition)


@dataclass(frozen=True)
class Read:
    """Records of a topic with a timestamp in [since_ms, until_ms]; partitions None: every partition."""

    topic: Topic[Any]
    since_ms: int
    until_ms: int
    partitions: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Record:
    topic: Topic[Any]
    partition: int
    offset: int
    timestamp_ms: int
    headers: list[tuple[str, bytes]]
    event: Mapping[str, Any]
    key: bytes | None = None


class Window:
    """One consumer (no group, nothing committed) reading several topic windows at once."""

    def __init__(self, bootstrap: str, namespace: str) -> None:
        self.namespace = namespace
        self.consumer = Consumer(
            {
                **client_config(bootstrap),
                "group.id": f"parley-window-{uuid.uuid4().hex}",  # never committed: no group state is kept
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
            }
        )

    def close(self) -> None:
        self.consumer.close()

    def __enter__(self) -> Window:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def partitions(self, topic: Topic[Any]) -> list[int]:
        name = named(topic, self.namespace)
        meta = self.consumer.list_topics(name, timeout=10).topics.get(name)
        if meta is None or meta.error is not None:
            raise LookupError(
                f"topic {name} does not exist (is this the right namespace and cluster?)"
            )
        return sorted(meta.partitions)

    def oldest_ms(self, topic: Topic[Any], timeout_s: float = 10.0) -> int | None:
        """The timestamp of the oldest record the topic still keeps (None: empty): where retention has cut.
        Reads the first retained record of every partition, all at once."""
        name = named(topic, self.namespace)
        starts = []
        for p in self.partitions(topic):
            low, high = self.consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)
            if low < high:
                starts.append(TopicPartition(name, p, low))
        if not starts:
            return None
        firsts: dict[int, int] = {}
        self.consumer.assign(starts)
        deadline = time.monotonic() + timeout_s
        try:
            while len(firsts) < len(starts) and time.monotonic() < deadline:
                msg = self.consumer.poll(0.5)
                if msg is not None and not msg.error():
                    firsts.setdefault(int(msg.partition() or 0), int(msg.timestamp()[1]))
        finally:
            self.consumer.unassign()
        return min(firsts.values()) if firsts else None

    def read(
        self,
        reads: list[Read],
        until: Callable[[], int | None] | None = None,
    ) -> Generator[Record, None, None]:
        """Every decodable record of the windows, in the order each partition holds them (partitions
        interleaved). `until()`, asked after each record, may pull every window's end earlier (the inspector
        stops once it has seen the run end). Poison records are skipped: they sit in the dead-letter topics."""
        topics: dict[str, Topic[Any]] = {}
        bounds: dict[Key, int] = {}
        wanted: list[TopicPartition] = []
        for r in reads:
            name = named(r.topic, self.namespace)
            topics[name] = r.topic
            for p in r.partitions if r.partitions is not None else self.partitions(r.topic):
                if (name, p) in bounds:
                    bounds[(name, p)] = max(bounds[(name, p)], r.until_ms)
                    continue
                bounds[(name, p)] = r.until_ms
                wanted.append(TopicPartition(name, p, max(0, r.since_ms)))
        if not wanted:
            return
        starts = self.consumer.offsets_for_times(wanted, timeout=10)
        ends: dict[Key, int] = {}
        assign = []
        for tp in starts:
            low, high = self.consumer.get_watermark_offsets(
                TopicPartition(tp.topic, tp.partition), timeout=10
            )
            start = tp.offset if tp.offset >= 0 else high  # -1: no record at or after that time
            if start < high:
                ends[(tp.topic, tp.partition)] = high
                assign.append(TopicPartition(tp.topic, tp.partition, max(start, low)))
        if not assign:
            return
        self.consumer.assign(assign)
        try:
            while ends:
                msg: Message | None = self.consumer.poll(1.0)
                if msg is None:
                    continue
                key = (str(msg.topic()), int(msg.partition() or 0))
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        ends.pop(key, None)
                    continue
                if key not in ends:
                    continue
                offset, stamp = int(msg.offset() or 0), int(msg.timestamp()[1])
                if offset >= ends[key] - 1:
                    ends.pop(key)
                limit = until() if until else None
                if stamp > min(bounds[key], limit if limit is not None else bounds[key]):
                    ends.pop(key, None)
                    continue
                topic = topics[key[0]]
                try:
                    event = codec.decode(topic.schema, msg.value())
                except PoisonEvent:
                    continue
                headers: list[tuple[str, bytes]] = []
                for pair in msg.headers() or []:
                    name, value = pair[0], pair[1]
                    headers.append(
                        (
                            str(name),
                            value if isinstance(value, bytes) else str(value or "").encode(),
                        )
                    )
                yield Record(topic, key[1], offset, stamp, headers, event, msg.key())
        finally:
            self.consumer.unassign()
