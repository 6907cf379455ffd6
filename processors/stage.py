"""The shell every faust stage shares: the app, raw Avro topics, dead letters, metrics and traces.

Values travel as raw bytes and are decoded here, not by a faust codec, so a malformed record becomes a
dead letter with its source offset instead of a crashed agent.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, cast

import faust
from faust.types import EventT, TopicT
from faust.web.exceptions import NotAuthenticated
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest

from processors.settings import ProcessorSettings
from runtime import logs, tracing
from runtime.failures import RETRIABLE
from runtime.outage import Outage
from topics import codec
from topics.codec import Event
from topics.errors import PoisonEvent
from topics.pipeline import Topic, check_consume, check_publish, dead_letter_name, named, process

E = TypeVar("E")  # a topic's event type
D = TypeVar("D")  # a stage's dependencies

log = logging.getLogger(__name__)


EVENTS = Counter(
    "parley_stage_events_total", "Events handled by a stage", ["stage", "topic", "outcome"]
)
LATENCY = Histogram(
    "parley_stage_event_seconds",
    "Time to handle one event (or one batch)",
    ["stage", "topic"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
RETRIES = Counter(
    "parley_stage_retries_total",
    "Events tried again because a store or the log was away",
    ["stage", "error"],
)


class Publish(Protocol):
    """What a handler publishes with: `Stage.publish`, or a fake that keeps the records in a unit test."""

    async def __call__(
        self, topic: Topic[E], record: E, *, key: str | None = None, partition: int | None = None
    ) -> None: ...


@dataclass(frozen=True)
class Handler(Generic[D]):
    """One topic's handler in a stage: `handle(event, deps)`, or `handle(events, deps)` for a batch."""

    topic: Topic[Any]
    handle: Callable[[Any, D], Awaitable[None]]
    batch: bool = False


def on(topic: Topic[E], handle: Callable[[E, D], Awaitable[None]]) -> Handler[D]:
    """Declare a handler of one event at a time; mypy holds the handler to the topic's event type."""
    return Handler(topic, handle)


def readiness(
    settled: bool, rebalancing: bool, settled_at: float | None, now: float, grace_s: float
) -> tuple[int, dict[str, Any]]:
    """A stage replica's readiness (pure). Settled with partitions: ready. Rebalancing after it held some within
    `grace_s`: still ready, so a group rebalanced by each scaling step never empties its Service (metering's
    pages answer throughout, and the replica resumes its partitions or hands them over). Never held any, or
    not since the grace ran out: 503, a replica starting or a standby (more replicas than partitions)."""
    if settled:
        return 200, {"status": "ok", "settled": True}
    recent = settled_at is not None and now - settled_at <= grace_s
    if rebalancing and recent:
        return 200, {"status": "rebalancing", "settled": False}
    return 503, {"status": "rebalancing" if rebalancing else "standby", "settled": False}


def on_batches(topic: Topic[E], handle: Callable[[list[E], D], Awaitable[None]]) -> Handler[D]:
    """Declare a handler of a batch of events (its size and wait: `Stage.serve`)."""
    return Handler(topic, handle, batch=True)


def credentials(settings: ProcessorSettings) -> faust.SASLCredentials | None:
    """The stage's Kafka sign-in when the brokers ask for one (runtime/kafka.py security: the same user, the
    same CA), for faust's own clients."""
    if not settings.kafka_username:
        return None
    return faust.SASLCredentials(
        username=settings.kafka_username,
        password=settings.kafka_password.get_secret_value(),
        mechanism="SCRAM-SHA-512",
        ssl_context=ssl.create_default_context(cafile=settings.kafka_ca_file or None),
    )


class Stage:
    """One faust app for one stage; agents are registered by the stage module."""

    def __init__(self, name: str, settings: ProcessorSettings) -> None:
        self.name = name
        self.settings = settings
        self.tracer = tracing.setup(f"parley-{name}")
        self.app = faust.App(
            settings.group(name),
            broker=f"kafka://{settings.kafka_bootstrap}",
            broker_credentials=credentials(settings),
            web_bind=settings.host,
            web_port=settings.web_port or process(name).port,
            web_in_thread=False,
            datadir=str(settings.datadir(name)),
            # A replica that dies stops heartbeating; after this its partitions go to the stage's other replicas.
            broker_session_timeout=settings.session_timeout_s,
            broker_heartbeat_interval=max(1.0, settings.session_timeout_s / 4),
            store="memory://",
            topic_disable_leader=True,
            topic_allow_declare=False,  # topics are declared before start (parley topics)
            producer_acks=-1,
            topic_replication_factor=settings.kafka_replication_factor,  # faust's own topics, if it makes any
            producer_partitioner=None,
            consumer_auto_offset_reset="earliest",
            broker_commit_every=100,
            broker_commit_interval=0.5,
        )
        self._topics: dict[str, TopicT] = {}
        self.outage = Outage(
            log, f"{name}: a store or the log (events wait, none is dead-lettered)"
        )
        self._settled_at: float | None = None  # when this replica last held partitions, settled

        @self.app.page("/metrics")
        async def metrics(web: Any, request: Any) -> Any:
            # aiohttp refuses a charset inside content_type; the exposition format is ASCII anyway.
            return web.bytes(generate_latest(), content_type=CONTENT_TYPE_LATEST.split(";")[0])

        @self.app.page("/livez")
        async def livez(web: Any, request: Any) -> Any:
            """Alive: the process's event loop answers. A liveness probe restarts the process only when not."""
            return web.json({"status": "ok", "stage": name})

        @self.app.page("/readyz")
        async def readyz(web: Any, request: Any) -> Any:
            """Ready (200) once this replica holds partitions, and through a rebalance of its group for
            `rebalance_grace_s` after it last held them (see `readiness`); `settled` says whether the group
            is settled now, which a stack that starts work only after its groups settled waits for."""
            now = time.monotonic()
            settled = bool(self.app.consumer.assignment()) and not self.app.rebalancing
            if settled:
                self._settled_at = now
            code, body = readiness(
                settled, self.app.rebalancing, self._settled_at, now, settings.rebalance_grace_s
            )
            return web.json({**body, "stage": name}, status=code)

    def topic(self, topic: Topic[Any]) -> TopicT:
        return self._raw(
            named(topic, self.settings.namespace), self.settings.layout.partitions(topic)
        )

    def dlq(self, topic: Topic[Any]) -> TopicT:
        return self._raw(dead_letter_name(topic, self.settings.namespace), 1)

    def _raw(self, name: str, partitions: int) -> TopicT:
        if name not in self._topics:
            self._topics[name] = self.app.topic(
                name,
                key_type=bytes,
                value_type=bytes,
                key_serializer="raw",
                value_serializer="raw",
                partitions=partitions,
                internal=False,
            )
        return self._topics[name]

    def require_internal(self, request: Any) -> None:
        """An internal page (anything but /metrics, /livez and /readyz): the caller presents the stack's internal
        token, or gets a 401; a local process cannot write usage rows or read anyone's usage by asking."""
        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(
            given, self.settings.internal_headers()["Authorization"].encode()
        ):
            raise NotAuthenticated(
                "This page is internal to the stack: present its internal token."
            )

    def crash_point(self, name: str) -> None:
        """Tests only: exit at once, as a killed process would, when `faults_dir/name` exists (it is removed
        first, so the restarted stage runs on). Off unless PARLEY_FAULTS_DIR is set."""
        if self.settings.faults_dir and (armed := Path(self.settings.faults_dir) / name).exists():
            armed.unlink()
            log.warning("fault %s: exiting before the offsets are committed", name)
            os._exit(70)

    async def publish(
        self,
        topic: Topic[E],
        record: E,
        *,
        key: str | None = None,
        partition: int | None = None,
    ) -> None:
        """Send and wait for the broker's ack: the input offset is committed only after this returns. A topic the
        pipeline does not declare this stage a producer of is refused (UndeclaredPublish)."""
        check_publish(self.name, topic)
        headers = [(k, v) for k, v in tracing.inject() if isinstance(v, bytes)]
        fut = await self.topic(topic).send(
            key=key.encode() if key is not None else None,
            value=codec.encode(topic.schema, cast(Event, record)),
            partition=partition,
            headers=headers,
            force=True,
        )
        await fut

    async def dead_letter(self, topic: Topic[Any], event: EventT[Any], error: str) -> None:
        msg = event.message
        source = f"{msg.topic}[{msg.partition}]@{msg.offset}"
        headers = [
            ("dlq.source", source.encode()),
            ("dlq.error", error.encode()[:1000]),
            ("dlq.stage", self.name.encode()),
        ]
        fut = await self.dlq(topic).send(key=msg.key, value=msg.value, headers=headers, force=True)
        await fut
        EVENTS.labels(self.name, topic.name, "dead_letter").inc()
        log.warning("%s: dead-lettered %s: %s", self.name, source, error)

    def serve(
        self, handlers: Sequence[Handler[D]], deps: D, batch: tuple[int, float] = (200, 0.5)
    ) -> None:
        """Consume each handler's topic and hand its events to the handler with the stage's dependencies;
        batch: the most events a batch handler gets at once, and how long a batch waits to fill."""
        for handler in handlers:
            handle = handler.handle

            def bound(
                event: Any, handle: Callable[[Any, D], Awaitable[None]] = handle
            ) -> Awaitable[None]:
                return handle(event, deps)

            if handler.batch:
                self.consume_batches(handler.topic, bound, *batch)
            else:
                self.consume(handler.topic, bound)

    def consume(self, topic: Topic[E], handle: Callable[[E], Awaitable[None]]) -> None:
        """One event at a time: decode, handle, and only then let faust ack the offset."""
        check_consume(self.name, topic)

        async def agent(stream: faust.StreamT[Any]) -> None:
            async for event in stream.events():
                await self._handle_one(topic, event, handle)

        agent.__name__ = f"{self.name}_{topic.schema}"
        self.app.agent(self.topic(topic), name=f"{self.name}.{topic.schema}")(agent)

    def consume_batches(
        self,
        topic: Topic[E],
        handle: Callable[[list[E]], Awaitable[None]],
        size: int,
        within: float,
    ) -> None:
        """Batches of events: decode each (poison ones to the dead-letter topic), handle the good ones together."""
        check_consume(self.name, topic)

        async def agent(stream: Any) -> None:  # faust's StreamT does not declare take_events
            async for events in stream.take_events(size, within=within):
                await self._handle_batch(topic, events, handle)

        agent.__name__ = f"{self.name}_{topic.schema}_batch"
        self.app.agent(self.topic(topic), name=f"{self.name}.{topic.schema}")(agent)

    async def _handle_one(
        self, topic: Topic[E], event: EventT[Any], handle: Callable[[E], Awaitable[None]]
    ) -> None:
        msg = event.message
        started = time.perf_counter()
        where = f"{msg.topic}[{msg.partition}]@{msg.offset}"
        with tracing.consumed_span(self.tracer, f"{self.name} {topic.name}", msg.headers) as span:
            span.set_attribute("messaging.kafka.offset", msg.offset)

            async def attempt() -> (
                None
            ):  # decoding too: a writer schema not seen yet waits for the registry
                await handle(cast(E, codec.decode(topic.schema, msg.value)))

            try:
                await self._with_retries(
                    where, attempt
                )  # retries what runtime/failures.py calls retriable
            except PoisonEvent as exc:
                await self.dead_letter(topic, event, str(exc))
                return
            except Exception as exc:
                # A valid record the stage cannot process is parked too, so one bad event never stalls a partition.
                log.exception(
                    "%s: failed on %s trace=%s", self.name, where, tracing.trace_id(msg.headers)
                )
                await self.dead_letter(topic, event, f"{type(exc).__name__}: {exc}")
                return
        EVENTS.labels(self.name, topic.name, "ok").inc()
        LATENCY.labels(self.name, topic.name).observe(time.perf_counter() - started)

    async def _with_retries(self, where: str, attempt: Callable[[], Awaitable[None]]) -> None:
        """A store or broker that is briefly away is waited for (the partition pauses), never dead-lettered."""
        delay = 0.1
        while True:
            try:
                await attempt()
                return
            except RETRIABLE as exc:
                RETRIES.labels(self.name, type(exc).__name__).inc()
                self.outage.failed(
                    f"{type(exc).__name__} on {where}; retrying, every {delay:.1f}s at most"
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _handle_batch(
        self,
        topic: Topic[E],
        events: Sequence[EventT[Any]],
        handle: Callable[[list[E]], Awaitable[None]],
    ) -> None:
        """The batch's failures, as one event's: a dependency away is waited for (the partition pauses); a record
        the handler fails on is found by handling the batch again one record at a time, and only that one is
        dead-lettered. Batch handlers are idempotent (a run's usage row is written once), so the records of
        the failed batch that are handled again are not counted twice."""
        started = time.perf_counter()
        good: list[tuple[EventT[Any], E]] = []
        for event in events:
            try:
                good.append((event, cast(E, codec.decode(topic.schema, event.message.value))))
            except PoisonEvent as exc:
                await self.dead_letter(topic, event, str(exc))
        if not good:
            return
        first, last = good[0][0].message, good[-1][0].message
        where = f"{first.topic}[{first.partition}]@{first.offset}..{last.offset}"
        carried = [event.message.headers for event, _ in good]
        handled = len(good)
        with tracing.consumed_batch(self.tracer, f"{self.name} {topic.name}", carried):
            try:
                await self._with_retries(where, lambda: handle([record for _, record in good]))
            except Exception:
                log.exception(
                    "%s: a batch failed on %s; handling it one record at a time", self.name, where
                )
                handled = 0
                for event, record in good:
                    msg = event.message
                    try:
                        await self._with_retries(where, functools.partial(handle, [record]))
                        handled += 1
                    except Exception as exc:
                        log.exception(
                            "%s: failed on %s[%s]@%s",
                            self.name,
                            msg.topic,
                            msg.partition,
                            msg.offset,
                        )
                        await self.dead_letter(topic, event, f"{type(exc).__name__}: {exc}")
        EVENTS.labels(self.name, topic.name, "ok").inc(handled)
        LATENCY.labels(self.name, topic.name).observe(time.perf_counter() - started)

    def run(self) -> None:
        from faust.worker import Worker

        worker = Worker(
            self.app,
            loglevel=self.settings.log_level.lower(),
            quiet=True,
            logging_config=logs.config(self.settings.log_level, self.settings.log_format),
        )
        worker.execute_from_commandline()
