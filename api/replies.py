"""The reply hub: this replica reads only its own reply partition, and hands each run's records to its stream.

Fan-out costs O(tokens): a delta is read by the one replica that holds the stream, not by every replica.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from functools import partial

from confluent_kafka import OFFSET_END, Consumer, KafkaError, Message, TopicPartition
from prometheus_client import Counter

from topics import codec
from topics.codec import Event
from topics.errors import PoisonEvent
from topics.kafka import ConsumerThread, consumer_config, until_ready
from topics.pipeline import RUN_REJECTED, TOKEN_DELTA, Topic, named

log = logging.getLogger(__name__)

RECORDS_READ = Counter("parley_edge_reply_records_read_total", "Reply records this replica read from Kafka")
RECORDS_FOR_STREAMS = Counter(
    "parley_edge_reply_records_dispatched_total", "Reply records handed to a stream this replica holds"
)


TERMINAL = frozenset({"completed", "error", "rejected"})  # kinds that end a run's stream


@dataclass(frozen=True)
class Reply:
    cursor: str  # durable position in the log: "<t|r>:<partition>:<offset>"
    kind: str  # started | delta | completed | error | rejected
    record: Event


def reply_topics(namespace: str) -> dict[str, tuple[str, Topic]]:
    """Broker name -> (cursor prefix, topic) of the two topics a run's stream is made of."""
    return {named(TOKEN_DELTA, namespace): ("t", TOKEN_DELTA), named(RUN_REJECTED, namespace): ("r", RUN_REJECTED)}


def to_reply(topics: dict[str, tuple[str, Topic]], msg: Message) -> tuple[str, Reply]:
    """(run id, Reply) of a consumed reply record; raises PoisonEvent when it does not decode."""
    prefix, topic = topics[str(msg.topic())]
    record = codec.decode(topic.schema, msg.value())
    if prefix == "r":
        run_id, kind = record["prompt"]["run_id"], "rejected"
    else:
        run_id, kind = record["run_id"], record["kind"]
    return run_id, Reply(f"{prefix}:{msg.partition()}:{msg.offset()}", kind, record)


@dataclass
class LiveRun:
    """One run's records as this replica reads them. When the client reads slower than the run produces and
    the bounded queue fills, the hub stops filling it and marks it overflowed: the stream then catches up
    from the log (Replay), so a slow client costs a bounded buffer, never unbounded memory or lost tokens.
    """

    queue: asyncio.Queue[Reply]
    overflowed: bool = False


class ReplyHub:
    def __init__(self, bootstrap: str, namespace: str, partition: int, buffer: int = 1024) -> None:
        self.partition = partition
        self.buffer = buffer
        self._topics = reply_topics(namespace)
        self._consumer = Consumer(
            consumer_config(bootstrap, f"edge-{namespace}-{partition}", **{"enable.partition.eof": False})
        )
        self._streams: dict[str, LiveRun] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader = ConsumerThread(self._consumer, "reply-hub", self._poll)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Assign our partition at its current end (explicit offsets: a run opened after start() is never missed)."""
        self._loop = loop
        assignment = []
        for name in self._topics:
            watermarks = partial(self._consumer.get_watermark_offsets, TopicPartition(name, self.partition), timeout=10)
            _low, high = until_ready("reply hub", watermarks)
            assignment.append(TopicPartition(name, self.partition, high if high >= 0 else OFFSET_END))
        self._reader.start(assignment)

    def stop(self) -> None:
        self._reader.stop()

    def open(self, run_id: str) -> LiveRun:
        """Register a run before its prompt is published, so none of its records can be missed."""
        live = LiveRun(asyncio.Queue(self.buffer))
        self._streams[run_id] = live
        return live

    def close(self, run_id: str) -> None:
        self._streams.pop(run_id, None)

    def _poll(self) -> None:
        """Read in batches and hand each batch to the event loop at once (one wake-up per batch, not per record)."""
        first = self._consumer.poll(0.05)  # wakes on the first record; then take what is already here
        if first is None:
            return
        batch = []
        messages = [first, *self._consumer.consume(500, 0)]
        for msg in messages:
            error = msg.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("reply consumer: %s", error)
                continue
            try:
                batch.append(to_reply(self._topics, msg))
            except PoisonEvent as exc:
                log.warning("skipping undecodable reply %s[%d]@%d: %s", msg.topic(), msg.partition(), msg.offset(), exc)
        RECORDS_READ.inc(len(messages))  # once per batch: a metric update costs a lock
        if batch:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._dispatch, batch)

    def _dispatch(self, batch: list[tuple[str, Reply]]) -> None:
        handed = 0
        for run_id, reply in batch:
            live = self._streams.get(run_id)
            if live is None:
                continue
            handed += 1
            try:
                live.queue.put_nowait(reply)
            except asyncio.QueueFull:
                log.info("run %s: client reads slower than the run; its stream catches up from the log", run_id)
                live.overflowed = True
                self._streams.pop(run_id, None)
        RECORDS_FOR_STREAMS.inc(handed)


def parse_cursor(cursor: str) -> tuple[str, int, int] | None:
    """'t:3:1200' -> ('t', 3, 1200); None when it is not a cursor this edge issued."""
    parts = cursor.split(":")
    if len(parts) != 3 or parts[0] not in ("t", "r") or not all(p.isdigit() for p in parts[1:]):
        return None
    return parts[0], int(parts[1]), int(parts[2])


class Replay:
    """Reads one run's reply records straight from its reply partition, from a cursor or from the run's start,
    and follows the partition live until the run's terminal record. Any replica can serve it; it costs one
    short-lived consumer for the resumed stream only.
    """

    def __init__(self, bootstrap: str, namespace: str, partition: int, run_id: str) -> None:
        self.partition = partition
        self.run_id = run_id
        self._names = reply_topics(namespace)
        self._consumer = Consumer(
            consumer_config(bootstrap, f"edge-replay-{namespace}", **{"enable.partition.eof": False})
        )
        self._after: tuple[str, int, int] | None = None
        self.finished = False

    def seek(self, since_ms: int, after: tuple[str, int, int] | None) -> None:
        """Start at the cursor's own record (its topic) and at the run's start time (the other topic)."""
        self._after = after
        starts = self._consumer.offsets_for_times(
            [TopicPartition(name, self.partition, since_ms) for name in self._names], timeout=10
        )
        assignment = []
        for tp in starts:
            prefix = self._names[tp.topic][0]
            offset = tp.offset
            if after is not None and after[0] == prefix:
                offset = after[2]  # read the cursor's record again to learn whether the run ended there
            elif offset < 0:  # no record at or after the run's start yet: read from the end
                offset = self._consumer.get_watermark_offsets(TopicPartition(tp.topic, self.partition), timeout=10)[1]
            assignment.append(TopicPartition(tp.topic, self.partition, offset))
        self._consumer.assign(assignment)

    def poll(self, timeout_s: float) -> Reply | None:
        """The next record of this run after the cursor, or None when none arrived within the timeout.

        Sets `finished` when the cursor itself was the run's terminal record; raises ValueError when the
        cursor points at a record of another run.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.finished:
            msg = self._consumer.poll(0.1)
            if msg is None or msg.error() is not None:
                continue
            try:
                run_id, reply = to_reply(self._names, msg)
            except PoisonEvent:
                continue
            if self._after is not None and reply.cursor == ":".join(map(str, self._after)):
                if run_id != self.run_id:
                    raise ValueError("the cursor belongs to another run")
                self.finished = reply.kind in TERMINAL
                continue
            if run_id == self.run_id:
                return reply
        return None

    def close(self) -> None:
        self._consumer.close()
