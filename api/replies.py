"""The reply hub: this replica reads only its own reply partition, and hands each run's records to its stream.

Fan-out costs O(tokens): a delta is read by the one replica that holds the stream, not by every replica.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass

from confluent_kafka import OFFSET_END, Consumer, KafkaError, TopicPartition

from topics import codec
from topics.codec import Event
from topics.errors import PoisonEvent
from topics.kafka import consumer_config
from topics.pipeline import RUN_REJECTED, TOKEN_DELTA, Topic, named

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reply:
    cursor: str  # durable position in the log: "<t|r>:<partition>:<offset>"
    kind: str  # started | delta | completed | error | rejected
    record: Event


class ReplyHub:
    def __init__(self, bootstrap: str, namespace: str, partition: int, buffer: int = 1024) -> None:
        self.partition = partition
        self.buffer = buffer
        self._topics: dict[str, tuple[str, Topic]] = {
            named(TOKEN_DELTA, namespace): ("t", TOKEN_DELTA),
            named(RUN_REJECTED, namespace): ("r", RUN_REJECTED),
        }
        self._consumer = Consumer(
            consumer_config(bootstrap, f"edge-{namespace}-{partition}", **{"enable.partition.eof": False})
        )
        self._streams: dict[str, asyncio.Queue[Reply]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = False
        self._thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Assign our partition at its current end (explicit offsets: a run opened after start() is never missed)."""
        self._loop = loop
        assignment = []
        for name in self._topics:
            _low, high = self._consumer.get_watermark_offsets(TopicPartition(name, self.partition), timeout=10)
            assignment.append(TopicPartition(name, self.partition, high if high >= 0 else OFFSET_END))
        self._consumer.assign(assignment)
        self._running = True
        self._thread = threading.Thread(target=self._poll, name="reply-hub", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._running = False
        if self._thread:
            self._thread.join(5)
        self._consumer.close()

    def open(self, run_id: str) -> asyncio.Queue[Reply]:
        """Register a run before its prompt is published, so none of its records can be missed."""
        queue: asyncio.Queue[Reply] = asyncio.Queue(self.buffer)
        self._streams[run_id] = queue
        return queue

    def close(self, run_id: str) -> None:
        self._streams.pop(run_id, None)

    def _poll(self) -> None:
        while self._running:
            msg = self._consumer.poll(0.05)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("reply consumer: %s", error)
                continue
            prefix, topic = self._topics[str(msg.topic())]
            try:
                record = codec.decode(topic.schema, msg.value())
            except PoisonEvent as exc:
                log.warning("skipping undecodable reply %s[%d]@%d: %s", msg.topic(), msg.partition(), msg.offset(), exc)
                continue
            run_id = record["prompt"]["run_id"] if prefix == "r" else record["run_id"]
            kind = "rejected" if prefix == "r" else record["kind"]
            reply = Reply(f"{prefix}:{msg.partition()}:{msg.offset()}", kind, record)
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._dispatch, run_id, reply)

    def _dispatch(self, run_id: str, reply: Reply) -> None:
        queue = self._streams.get(run_id)
        if queue is None:
            return
        try:
            queue.put_nowait(reply)
        except asyncio.QueueFull:
            # The client stopped reading; the run goes on and is persisted, the stream is dropped.
            log.warning("stream of run %s overflowed its buffer; closing it", run_id)
            self._streams.pop(run_id, None)
