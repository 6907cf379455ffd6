"""The reply hub: this replica reads only its own reply partitions, and hands each run's records to its stream.

Fan-out costs O(tokens): a delta is read by the one replica that holds the stream, not by every replica.
Replicas claim their partitions by joining one consumer group over both reply topics (range assignment: the
same partition numbers of each topic go to the same replica), so adding a replica needs no hand-set partition,
and the partitions of one that dies go to the others once its session times out. A replica whose partition
moves away mid-stream hands that stream over to a read from the log (Replay), which any replica can serve.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any, TypedDict, cast

from confluent_kafka import (
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from prometheus_client import Counter

from runtime.kafka import ConsumerThread, consumer_config
from runtime.outage import Outage
from topics import codec
from topics.errors import PoisonEvent
from topics.events import RunRejected, TokenDelta
from topics.pipeline import RUN_REJECTED, TOKEN_DELTA, Topic, named

log = logging.getLogger(__name__)

RECORDS_READ = Counter(
    "parley_edge_reply_records_read_total", "Reply records this replica read from Kafka"
)
RECORDS_FOR_STREAMS = Counter(
    "parley_edge_reply_records_dispatched_total",
    "Reply records handed to a stream this replica holds",
)


TERMINAL = frozenset({"completed", "error", "rejected"})  # kinds that end a run's stream
REJECTED = "rejected"  # from the rejections topic
ACCEPTED = "accepted"  # not from the log: the run is kept while the scheduler has not decided yet (the edge's own)
HANDOFF = "handoff"  # not from the log: the hub no longer reads this run's partition; read the rest from the log


class Accepted(TypedDict):
    """The edge's own record of a run it kept before the scheduler decided (no log record behind it)."""

    run_id: str
    chat_id: str
    model: str | None


@dataclass(frozen=True)
class Reply:
    cursor: str  # durable position in the log: "<t|r>:<partition>:<offset>"
    kind: str  # queued | started | delta | moderation | completed | error | rejected, or the edge's own two
    record: TokenDelta | RunRejected | Accepted | None  # None: a hand-off

    @property
    def delta(self) -> TokenDelta:
        """The record, of every kind read from the token-delta topic."""
        if self.kind in (REJECTED, ACCEPTED, HANDOFF):
            raise TypeError(f"a {self.kind} reply has no token-delta record")
        return cast(TokenDelta, self.record)

    @property
    def rejection(self) -> RunRejected:
        if self.kind != REJECTED:
            raise TypeError(f"a {self.kind} reply is not a rejection")
        return cast(RunRejected, self.record)

    @property
    def accepted(self) -> Accepted:
        if self.kind != ACCEPTED:
            raise TypeError(f"a {self.kind} reply is not the edge's own")
        return cast(Accepted, self.record)


def reply_topics(namespace: str) -> dict[str, tuple[str, Topic[Any]]]:
    """Broker name -> (cursor prefix, topic) of the two topics a run's stream is made of."""
    return {
        named(TOKEN_DELTA, namespace): ("t", TOKEN_DELTA),
        named(RUN_REJECTED, namespace): ("r", RUN_REJECTED),
    }


def to_reply(topics: dict[str, tuple[str, Topic[Any]]], msg: Message) -> tuple[str, Reply]:
    """(run id, Reply) of a consumed reply record; raises PoisonEvent when it does not decode."""
    prefix, topic = topics[str(msg.topic())]
    cursor = f"{prefix}:{msg.partition()}:{msg.offset()}"
    if prefix == "r":
        rejection = cast(RunRejected, codec.decode(topic.schema, msg.value()))
        return rejection["prompt"]["run_id"], Reply(cursor, REJECTED, rejection)
    delta = cast(TokenDelta, codec.decode(topic.schema, msg.value()))
    return delta["run_id"], Reply(cursor, delta["kind"], delta)


@dataclass
class LiveRun:
    """One run's records as this replica reads them. When the client reads slower than the run produces and
    the bounded queue fills, the hub stops filling it and marks it overflowed: the stream then catches up
    from the log (Replay), so a slow client costs a bounded buffer, never unbounded memory or lost tokens.
    """

    queue: asyncio.Queue[Reply]
    overflowed: bool = False


class NoReplyPartition(Exception):
    """This replica holds no reply partition right now (its group is rebalancing, or it is a standby)."""


class ReplyHub:
    def __init__(
        self,
        bootstrap: str,
        namespace: str,
        session_timeout_s: float = 10.0,
        buffer: int = 1024,
        group: str = "",  # the edge replicas' group unless named (a test's hub of its own)
    ) -> None:
        self.buffer = buffer
        self._topics = reply_topics(namespace)
        group = group or f"{namespace or 'parley'}.edge"
        extra = {
            "enable.partition.eof": False,
            "partition.assignment.strategy": "range",  # partition p of both topics to the same replica
            "session.timeout.ms": int(session_timeout_s * 1000),
            "heartbeat.interval.ms": int(session_timeout_s * 250),
        }
        self._consumer = Consumer(consumer_config(bootstrap, group, **extra))
        self._streams: dict[
            str, tuple[int, LiveRun]
        ] = {}  # run id -> (its reply partition, its queue)
        self._owned: tuple[int, ...] = ()
        self._turn = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader = ConsumerThread(self._consumer, "reply-hub", self._poll)
        self._outage = Outage(log, "Kafka (the edge's reply consumer)")

    @property
    def partitions(self) -> tuple[int, ...]:
        """The reply partitions this replica reads now."""
        return self._owned

    def start(self, loop: asyncio.AbstractEventLoop, timeout_s: float = 60.0) -> None:
        """Join the edge group and wait for a first assignment (a replica with none still serves resumes)."""
        self._loop = loop
        self._consumer.subscribe(
            list(self._topics), on_assign=self._assigned, on_revoke=self._revoked
        )
        self._reader.start(None)
        deadline = time.monotonic() + timeout_s
        while not self._owned and time.monotonic() < deadline:
            time.sleep(0.05)
        log.info("reply partitions %s", list(self._owned) or "none yet")

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Read each new partition from its current end: only runs opened from now on are streamed from here.
        The end is looked up now, not left to the first fetch (OFFSET_END): a run opened the moment the
        partition is held must find every one of its records, and a fetch resolved later, under load, would
        start after the first of them (CI: test_backpressure's 20 records were all skipped)."""
        starts = []
        for tp in partitions:
            try:
                _, end = consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=5
                )
            except KafkaException:
                end = OFFSET_END  # the broker did not say: the first fetch decides, as before
            starts.append(TopicPartition(tp.topic, tp.partition, end))
        consumer.assign(starts)
        self._owned = tuple(sorted({tp.partition for tp in partitions}))
        log.info("reply partitions assigned: %s", list(self._owned))

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        lost = {tp.partition for tp in partitions}
        self._owned = tuple(p for p in self._owned if p not in lost)
        consumer.unassign()
        moved = [
            run_id for run_id, (partition, _) in list(self._streams.items()) if partition in lost
        ]
        if moved and self._loop is not None:
            self._loop.call_soon_threadsafe(self._hand_off, moved)
        log.info(
            "reply partitions revoked: %s (%d streams continue from the log)",
            sorted(lost),
            len(moved),
        )

    def _hand_off(self, run_ids: list[str]) -> None:
        for run_id in run_ids:
            entry = self._streams.pop(run_id, None)
            if entry is None:
                continue
            entry[1].overflowed = True
            if not entry[1].queue.full():  # wake the stream; a full queue is drained first anyway
                entry[1].queue.put_nowait(Reply("", HANDOFF, None))

    def stop(self) -> None:
        self._reader.stop()

    def pick(self) -> int:
        """A reply partition of this replica for a new run (round robin over those it holds)."""
        owned = self._owned
        if not owned:
            raise NoReplyPartition("this edge replica holds no reply partition right now")
        return owned[next(self._turn) % len(owned)]

    def open(self, run_id: str, partition: int) -> LiveRun:
        """Register a run before its prompt is published, so none of its records can be missed."""
        live = LiveRun(asyncio.Queue(self.buffer))
        self._streams[run_id] = (partition, live)
        return live

    def close(self, run_id: str) -> None:
        self._streams.pop(run_id, None)

    def _poll(self) -> None:
        """Read in batches and hand each batch to the event loop at once (one wake-up per batch, not per record)."""
        first = self._consumer.poll(
            0.05
        )  # wakes on the first record; then take what is already here
        if first is None:
            return
        batch = []
        messages = [first, *self._consumer.consume(500, 0)]
        for msg in messages:
            error = msg.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    self._outage.failed(str(error))
                continue
            try:
                batch.append(to_reply(self._topics, msg))
            except PoisonEvent as exc:
                log.warning(
                    "skipping undecodable reply %s[%d]@%d: %s",
                    msg.topic(),
                    msg.partition(),
                    msg.offset(),
                    exc,
                )
        RECORDS_READ.inc(len(messages))  # once per batch: a metric update costs a lock
        if batch:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._dispatch, batch)

    def _dispatch(self, batch: list[tuple[str, Reply]]) -> None:
        handed = 0
        for run_id, reply in batch:
            entry = self._streams.get(run_id)
            if entry is None:
                continue
            live = entry[1]
            handed += 1
            try:
                live.queue.put_nowait(reply)
            except asyncio.QueueFull:
                log.info(
                    "run %s: client reads slower than the run; its stream catches up from the log",
                    run_id,
                )
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
            consumer_config(
                bootstrap, f"edge-replay-{namespace}", **{"enable.partition.eof": False}
            )
        )
        self._after: tuple[str, int, int] | None = None
        self.finished = False
        self._next: dict[str, int] = {}  # per topic: the offset read next
        self._ends: dict[str, int] = {}  # per topic: the end of the partition when the read began

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
                offset = after[
                    2
                ]  # read the cursor's record again to learn whether the run ended there
            elif offset < 0:  # no record at or after the run's start yet: read from the end
                offset = self._consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, self.partition), timeout=10
                )[1]
            assignment.append(TopicPartition(tp.topic, self.partition, offset))
            self._next[tp.topic] = offset
            self._ends[tp.topic] = self._consumer.get_watermark_offsets(
                TopicPartition(tp.topic, self.partition), timeout=10
            )[1]
        self._consumer.assign(assignment)

    def caught_up(self) -> bool:
        """Every record written before the read began has been read (a snapshot of a run still going)."""
        return all(self._next[t] >= end for t, end in self._ends.items())

    def poll(self, timeout_s: float) -> Reply | None:
        """The next record of this run after the cursor, or None when none arrived within the timeout.

        Sets `finished` when the cursor itself was the run's terminal record; raises ValueError when the
        cursor points at a record of another run.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.finished:
            msg = self._consumer.poll(0.1)
            if msg is None or msg.error() is not None:
                if self.caught_up():
                    return None
                continue
            self._next[str(msg.topic())] = int(msg.offset() or 0) + 1
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
