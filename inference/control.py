"""RunControl for an inference consumer: which of its runs were cancelled.

Every consumer reads the whole control topic with no consumer group (control events are rare), from a
window back in time, so a cancel that arrived before the run was picked up, or before this consumer
(re)started and took the run over, still applies. Only the consumer holding the run acts on it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from runtime.kafka import ConsumerThread, consumer_config, until_ready
from topics import codec
from topics.errors import PoisonEvent
from topics.pipeline import RUN_CONTROL

log = logging.getLogger(__name__)


class RunControls:
    def __init__(self, bootstrap: str, topic: str, window_s: float = 900.0) -> None:
        self.topic = topic
        self.window_s = window_s
        self._consumer = Consumer(
            consumer_config(bootstrap, f"{topic}.reader", **{"enable.partition.eof": False})
        )
        self._cancelled: OrderedDict[str, float] = (
            OrderedDict()
        )  # run id -> cancel requested at (epoch s)
        self._active: dict[str, asyncio.Event] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader = ConsumerThread(self._consumer, "run-control", self._poll)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        since_ms = int((time.time() - self.window_s) * 1000)

        def starts_at() -> list[TopicPartition]:
            # A broker that has just started may list the topic before its partitions have leaders: no
            # partitions yet is "not ready", not an empty topic (it made offsets_for_times fail, for good).
            metadata = self._consumer.list_topics(self.topic, timeout=10).topics[self.topic]
            if not metadata.partitions:
                raise KafkaException(
                    KafkaError(
                        KafkaError.LEADER_NOT_AVAILABLE, f"{self.topic} has no partitions yet"
                    )
                )
            wanted = [TopicPartition(self.topic, p, since_ms) for p in metadata.partitions]
            return list(self._consumer.offsets_for_times(wanted, timeout=10))

        starts = until_ready("run control", starts_at)
        self._reader.start(starts)

    def stop(self) -> None:
        self._reader.stop()

    def watch(self, run_id: str) -> asyncio.Event:
        """The event that is set when `run_id` is cancelled (already set if it was cancelled before)."""
        event = asyncio.Event()
        if run_id in self._cancelled:
            event.set()
        self._active[run_id] = event
        return event

    def release(self, run_id: str) -> None:
        self._active.pop(run_id, None)

    def requested_at(self, run_id: str) -> float | None:
        return self._cancelled.get(run_id)

    def _poll(self) -> None:
        msg = self._consumer.poll(0.1)
        if msg is None or msg.error() is not None:
            return
        try:
            control = codec.decode(RUN_CONTROL.schema, msg.value())
        except PoisonEvent as exc:
            log.warning("skipping undecodable control record @%s: %s", msg.offset(), exc)
            return
        assert self._loop is not None
        self._loop.call_soon_threadsafe(
            self._cancel, control["run_id"], control["requested_at"] / 1000
        )

    def _cancel(self, run_id: str, at: float) -> None:
        self._cancelled[run_id] = at
        horizon = time.time() - self.window_s
        while self._cancelled and next(iter(self._cancelled.values())) < horizon:
            self._cancelled.popitem(last=False)
        event = self._active.get(run_id)
        if event is not None and not event.is_set():
            log.info("run %s: cancel requested; stopping it at the next decode step", run_id)
            event.set()
