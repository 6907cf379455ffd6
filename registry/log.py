"""The registry's storage: one compacted, replicated Kafka topic (`_schemas`), read whole at start and followed
after, so every registry replica sees what the others register."""

from __future__ import annotations

import json
import logging
import threading
import time
from functools import partial
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from registry.store import Store
from runtime.kafka import (
    ConsumerThread,
    consumer_config,
    producer_config,
    until_ready,
)
from runtime.kafka_auth import client_config
from topics.pipeline import Layout

log = logging.getLogger(__name__)


class SchemaLog:
    def __init__(self, bootstrap: str, topic: str, layout: Layout) -> None:
        self.bootstrap, self.topic, self.layout = bootstrap, topic, layout
        self.producer = Producer(producer_config(bootstrap, **{"linger.ms": 0}))
        self._consumer = Consumer(
            consumer_config(bootstrap, f"registry-{id(self)}", **{"enable.partition.eof": False})
        )
        self._follower: ConsumerThread | None = None
        self._store: Store | None = None
        self._lock = threading.Lock()

    def _create(self) -> None:
        admin = AdminClient(client_config(self.bootstrap))
        if (
            self.topic
            in until_ready("registry topic", partial(admin.list_topics, timeout=10)).topics
        ):
            return
        config = {**self.layout.config(), "cleanup.policy": "compact"}
        topic = NewTopic(
            self.topic,
            num_partitions=1,
            replication_factor=self.layout.replication_factor,
            config=config,
        )
        try:
            admin.create_topics([topic])[self.topic].result()
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise

    def start(self, store: Store) -> None:
        """Create the topic if missing, apply every record up to its end, then keep following it."""
        self._create()
        self._store = store
        partition = TopicPartition(self.topic, 0, OFFSET_BEGINNING)
        _, end = until_ready(
            "registry end", partial(self._consumer.get_watermark_offsets, partition, timeout=10)
        )
        self._consumer.assign([partition])
        position = 0
        deadline = time.monotonic() + 120
        while position < end and time.monotonic() < deadline:
            msg = self._consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                self._apply(msg)
                position = (msg.offset() or 0) + 1
        if position < end:
            raise RuntimeError(f"read {position} of {end} records of {self.topic}")
        self._follower = ConsumerThread(self._consumer, "registry-follower", self._follow)
        self._follower.start([TopicPartition(self.topic, 0, position)])

    def _follow(self) -> None:
        msg = self._consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            self._apply(msg)

    def _apply(self, msg: Message) -> None:
        try:
            key = json.loads(msg.key() or b"{}")
            raw = msg.value()
            value = json.loads(raw) if raw else None
        except ValueError:
            log.warning("skipping a record of %s@%d that is not JSON", self.topic, msg.offset())
            return
        assert self._store is not None  # noqa: S101 (start() sets it before any record is read)
        with self._lock:
            self._store.apply(key, value)

    def write(self, key: dict[str, Any], value: dict[str, Any] | None) -> None:
        """Append one record and wait until every in-sync copy has it."""
        failed: list[str] = []
        self.producer.produce(
            self.topic,
            key=json.dumps(key, sort_keys=True).encode(),
            value=None if value is None else json.dumps(value, sort_keys=True).encode(),
            on_delivery=lambda err, _msg: failed.append(str(err)) if err else None,
        )
        if self.producer.flush(30) or failed:
            raise RuntimeError(f"could not write to {self.topic}: {failed or 'timed out'}")

    def stop(self) -> None:
        if self._follower:
            self._follower.stop()
        self.producer.flush(5)
