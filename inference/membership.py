"""A consumer's place in its pool's group: the partitions it holds, joining and leaving, and its commits.

Every call on the confluent consumer runs on one thread (confluent-kafka's consumer is not thread-safe, and
its poll blocks), reached from the event loop through `call`. A partition assigned here records its end at
that moment: a run read from before it may have been begun by the partition's previous owner. A partition
revoked (or lost) first hands its runs off: the consumer's `hand_off` stops them between decode steps and
flushes what they generated, so the new owner continues each where it stopped
(docs/decisions/0005-inference-pools-and-takeover.md).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from confluent_kafka import Consumer, Message, TopicPartition

from inference.metrics import TAKING_WORK
from inference.offsets import OffsetTracker
from inference.settings import InferenceSettings
from runtime.kafka import consumer_config, until_ready
from topics.pipeline import RUN_SCHEDULED, named

log = logging.getLogger(__name__)


def position(msg: Message) -> tuple[str, int, int]:
    """topic, partition, offset of a consumed (non-error) message."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


class Membership:
    def __init__(
        self, settings: InferenceSettings, hand_off: Callable[[set[int]], Coroutine[Any, Any, None]]
    ) -> None:
        self.pool = settings.pool
        self.topic = named(RUN_SCHEDULED[settings.pool], settings.namespace)
        self.consumer = Consumer(
            consumer_config(
                settings.kafka_bootstrap,
                settings.group(f"inference.{settings.pool}"),
                **{
                    "max.poll.interval.ms": 600_000,
                    "session.timeout.ms": settings.session_timeout_ms,
                    "heartbeat.interval.ms": max(500, settings.session_timeout_ms // 6),
                    # A rebalance moves only the partitions it must: chats stay on the engine holding them warm.
                    "partition.assignment.strategy": "cooperative-sticky",
                },
            )
        )
        self.hand_off = hand_off
        self.offsets = OffsetTracker()
        self.fresh_from: dict[
            int, int
        ] = {}  # partition -> its end when assigned: later records are new runs
        self.owned: frozenset[int] = (
            frozenset()
        )  # partitions assigned now (published in the status)
        self.subscribed = False
        self._thread = ThreadPoolExecutor(
            1, thread_name_prefix="consumer"
        )  # every consumer call, one thread
        self._loop: asyncio.AbstractEventLoop | None = None

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        self._loop = asyncio.get_running_loop()
        return await self._loop.run_in_executor(self._thread, fn, *args)

    def maybe_started(self, partition: int, offset: int) -> bool:
        """Read from before this consumer had the partition: its previous owner may have begun the run."""
        return offset < self.fresh_from.get(partition, 0)

    def commit(self, msg: Message) -> None:
        """The run of `msg` is over here: commit up to the oldest run of its partition not yet over."""
        topic, partition, offset = position(msg)
        tp = TopicPartition(topic, partition, self.offsets.finished(partition, offset))
        self.consumer.commit(offsets=[tp], asynchronous=True)

    async def join(self) -> None:
        await self.call(
            lambda: self.consumer.subscribe(
                [self.topic],
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_revoke,
            )
        )
        self.subscribed = True
        TAKING_WORK.labels(self.pool).set(1)

    async def leave(self) -> None:
        def leave() -> None:
            self.consumer.unsubscribe()
            deadline = time.monotonic() + 30
            while self.consumer.assignment() and time.monotonic() < deadline:
                self.consumer.poll(
                    0.1
                )  # serves the revoke (hand-off); a record read now stays uncommitted

        await self.call(leave)
        self.subscribed = False
        TAKING_WORK.labels(self.pool).set(0)

    async def close(self) -> None:
        await self.call(self.consumer.close)
        self._thread.shutdown()

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.fresh_from[tp.partition] = self._end_now(consumer, tp)
        self.owned = self.owned | {
            tp.partition for tp in partitions
        }  # rebound, not mutated: status() reads it
        if partitions:
            log.info(
                "assigned partitions %s of %s",
                sorted(tp.partition for tp in partitions),
                self.topic,
            )

    @staticmethod
    def _end_now(consumer: Consumer, tp: TopicPartition, timeout_s: float = 15.0) -> int:
        """The partition's end as of its assignment, asked again while a broker that just died leaves errors
        behind. An error must not leave the rebalance callback: it surfaces from poll() and ended the consumer
        thread (CI: "Broker handle destroyed" after the leader broker's kill -9, the pool's partitions then
        unserved for minutes). Unknown after timeout_s: every record already there counts as maybe started,
        so each is checked against its reply partition before it runs."""
        ask = partial(
            consumer.get_watermark_offsets, TopicPartition(tp.topic, tp.partition), timeout=5
        )
        try:
            return int(until_ready(f"end of partition {tp.partition}", ask, timeout_s)[1])
        except Exception as exc:  # nothing may escape the callback
            log.warning(
                "end of partition %d unknown (%s): its waiting runs are checked", tp.partition, exc
            )
            return sys.maxsize

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Runs of partitions leaving this consumer stop and flush what they generated before the partitions
        go (this blocks the rebalance briefly), so their new owner continues each run where it stopped."""
        numbers = {tp.partition for tp in partitions}
        self.owned = self.owned - numbers
        if not numbers:
            return
        assert self._loop is not None
        handed = asyncio.run_coroutine_threadsafe(self.hand_off(numbers), self._loop)
        try:
            handed.result(timeout=60)
        except Exception:
            log.exception("hand-off of partitions %s did not finish", sorted(numbers))
        self.offsets.forget(list(numbers))
        for number in numbers:
            self.fresh_from.pop(number, None)
        log.info("revoked partitions %s of %s", sorted(numbers), self.topic)
