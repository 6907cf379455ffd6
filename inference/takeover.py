"""What a run already published before its consumer failed: read back from its reply partition.

A consumer that picks up a run which another consumer may have started (any record that was already in the
partition when it was assigned) reads the run's TokenDelta records from the log. Generation then continues
after the published text, so the client's stream goes on with no duplicated text; a run that had already
ended only has its RunCompleted published again (the sinks are idempotent by run).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition

from topics import codec
from topics.codec import Event
from topics.errors import PoisonEvent
from topics.kafka import consumer_config
from topics.pipeline import TOKEN_DELTA

CLOCK_SKEW_MS = 60_000  # records are looked up by producer timestamp; hosts' clocks may differ this much


@dataclass
class Prior:
    """A run's published progress (empty for a run nobody started)."""

    text: str = ""
    seq: int = -1  # the last record's seq; -1 when nothing was published
    tokens: int = 0  # completion tokens behind `text`
    terminal: Event | None = None  # the completed/error record, when the run had ended

    @property
    def started(self) -> bool:
        return self.seq >= 0


def prior_of(records: list[Event]) -> Prior:
    """Fold a run's records (any order, possibly repeated) into its progress (pure)."""
    prior = Prior()
    seen: set[int] = set()
    for record in sorted(records, key=lambda r: r["seq"]):
        if record["seq"] in seen:
            continue
        seen.add(record["seq"])
        prior.seq = record["seq"]
        if record["kind"] == "delta":
            prior.text += record["text"]
        if record.get("tokens") is not None:
            prior.tokens = record["tokens"]
        if record["kind"] in ("completed", "error") and prior.terminal is None:
            prior.terminal = record
    return prior


def published(bootstrap: str, topic: str, partition: int, run_id: str, since_ms: int, group: str) -> list[Event]:
    """The run's TokenDelta records in its reply partition, from `since_ms` up to the partition's end now."""
    consumer = Consumer(consumer_config(bootstrap, group, **{"enable.partition.eof": True}))
    try:
        start = consumer.offsets_for_times([TopicPartition(topic, partition, since_ms - CLOCK_SKEW_MS)], timeout=10)
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        offset = start[0].offset
        if offset < 0 or offset >= high:
            return []
        consumer.assign([TopicPartition(topic, partition, offset)])
        found: list[Event] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    break
                continue
            try:
                record = codec.decode(TOKEN_DELTA.schema, msg.value())
            except PoisonEvent:
                record = None
            if record is not None and record["run_id"] == run_id:
                found.append(record)
            if (msg.offset() or 0) >= high - 1:
                break
        else:
            raise TimeoutError(f"could not read reply partition {partition} of {topic} to its end")
        return found
    finally:
        consumer.close()
