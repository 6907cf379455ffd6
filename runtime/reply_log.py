"""A run's records in its reply partition, read back from the log: what a consumer taking over a run continues
after (inference/takeover.py), and whether a run scheduled again had already told the edge it was queued."""

from __future__ import annotations

import time
from typing import cast

from confluent_kafka import Consumer, KafkaError, TopicPartition

from runtime.kafka import consumer_config
from topics import codec
from topics.errors import PoisonEvent
from topics.events import TokenDelta
from topics.pipeline import TOKEN_DELTA

# records are looked up by producer timestamp; hosts' clocks may differ this much
CLOCK_SKEW_MS = 60_000


def published(
    bootstrap: str, topic: str, partition: int, run_id: str, since_ms: int, group: str
) -> list[TokenDelta]:
    """The run's TokenDelta records in its reply partition, from `since_ms` up to the partition's end now."""
    consumer = Consumer(consumer_config(bootstrap, group, **{"enable.partition.eof": True}))
    try:
        start = consumer.offsets_for_times(
            [TopicPartition(topic, partition, since_ms - CLOCK_SKEW_MS)], timeout=10
        )
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        offset = start[0].offset
        if offset < 0 or offset >= high:
            return []
        consumer.assign([TopicPartition(topic, partition, offset)])
        found: list[TokenDelta] = []
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
                record = cast(TokenDelta, codec.decode(TOKEN_DELTA.schema, msg.value()))
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
