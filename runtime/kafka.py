"""confluent-kafka plumbing for the edge and the inference consumers: configs, topic creation, dead letters."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)

from runtime import tracing
from runtime.kafka_auth import client_config
from topics import codec
from topics.codec import Event
from topics.pipeline import TOPICS, Layout, Topic, check_publish, dead_letter_name, named

log = logging.getLogger(__name__)
T = TypeVar("T")
E = TypeVar("E")  # a topic's event type


class ConsumerThread:
    """A consumer read on a daemon thread (confluent-kafka's poll blocks, so it stays off any event loop):
    `step` runs over and over from start() until stop(), which joins the thread and closes the consumer.
    The reply hub, the run-control reader, the table readers and the placements follower each run one."""

    def __init__(self, consumer: Consumer, name: str, step: Callable[[], None]) -> None:
        self.consumer = consumer
        self._name = name
        self._step = step
        self._running = False
        self._thread: threading.Thread | None = None

    def start(self, assignment: list[TopicPartition] | None) -> None:
        """Read the given partitions, or (None) those of the group the caller has subscribed the consumer to."""
        if assignment is not None:
            self.consumer.assign(assignment)
        self._running = True
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while self._running:
            self._step()

    def stop(self) -> None:
        self._running = False
        if self._thread:
            self._thread.join(5)
        self.consumer.close()


# a record not acknowledged by then fails (librdkafka's default is 5 minutes)
DELIVERY_TIMEOUT_MS = 30_000


def producer_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    return {
        **client_config(bootstrap),
        # Long enough for a leader election after a broker dies (seconds), short enough that a client whose
        # request the log cannot take (too few copies in sync) gets an error instead of a hang.
        "delivery.timeout.ms": DELIVERY_TIMEOUT_MS,
        "enable.idempotence": True,  # no duplicates from producer retries
        # Back to a restarted broker within a second (librdkafka's default backs off up to 10 s): a record the
        # log already delivers is acknowledged as fast, which storage/withdrawals.py counts on.
        "reconnect.backoff.max.ms": 1000,
        "acks": "all",  # acknowledged once every in-sync copy has it (at least min.insync.replicas)
        # Every record on the path to a first token is sent alone and awaited: a linger adds its whole wait to
        # each hop (bench/pipeline_ttft.py). Token deltas are batched by the coalescer, not here.
        "linger.ms": 0,
        # The same partitioner as aiokafka/faust (murmur2), so a chat_id lands on one partition whoever writes.
        "partitioner": "murmur2_random",
        **extra,
    }


def consumer_config(bootstrap: str, group: str, **extra: Any) -> dict[str, Any]:
    return {
        **client_config(bootstrap),
        "group.id": group,
        "enable.auto.commit": False,  # offsets are committed only after the effect is durable
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        **extra,
    }


def ensure_topics(
    bootstrap: str, namespace: str, layout: Layout, topics: tuple[Topic[Any], ...] = TOPICS
) -> list[str]:
    """Create every pipeline topic and its dead-letter topic if missing, with the layout's partitions and
    replication, and give the existing ones the layout's retention (a period changed in the settings applies to
    the records already in the log); returns the names created."""
    admin = AdminClient(client_config(bootstrap))
    existing = set(admin.list_topics(timeout=10).topics)
    wanted: list[NewTopic] = []
    periods: dict[str, str] = {}
    for topic in topics:
        for name, parts, config in (
            (named(topic, namespace), layout.partitions(topic), layout.config(topic)),
            (dead_letter_name(topic, namespace), 1, layout.config()),
        ):
            if name in existing and "retention.ms" in config:
                periods[name] = config["retention.ms"]
            elif name not in existing:
                wanted.append(
                    NewTopic(
                        name,
                        num_partitions=parts,
                        replication_factor=layout.replication_factor,
                        config=config,
                    )
                )
    created = []
    for name, future in admin.create_topics(wanted).items() if wanted else ():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    led(admin, [t.topic for t in wanted])
    align_retention(admin, periods)
    return created


def align_retention(admin: AdminClient, periods: dict[str, str]) -> list[str]:
    """Set retention.ms on each named topic whose own differs; returns the names changed. The broker then
    deletes a closed segment once its newest record is older than the period (docs/privacy.md)."""
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in periods]
    if not resources:
        return []
    changed = []
    for resource, future in admin.describe_configs(resources).items():
        entry = future.result(timeout=30).get("retention.ms")
        if entry is None or entry.value != periods[resource.name]:
            changed.append(resource.name)
    alter = [
        ConfigResource(
            ConfigResource.Type.TOPIC,
            name,
            incremental_configs=[
                ConfigEntry(
                    "retention.ms",
                    periods[name],
                    incremental_operation=AlterConfigOpType.SET,
                )
            ],
        )
        for name in changed
    ]
    for resource, future in admin.incremental_alter_configs(alter).items() if alter else ():
        future.result(timeout=30)
        log.info("%s: retention.ms %s", resource.name, periods[resource.name])
    return changed


def delete_topics(bootstrap: str, namespace: str) -> list[str]:
    """Delete every topic of a namespace (a finished replay's, a benchmark's); returns the names deleted."""
    admin = AdminClient(client_config(bootstrap))
    mine = [t for t in admin.list_topics(timeout=10).topics if t.startswith(f"{namespace}.")]
    for future in admin.delete_topics(mine, operation_timeout=30).values() if mine else ():
        future.result()
    return mine


def led(admin: AdminClient, names: list[str], timeout_s: float = 60.0) -> None:
    """Wait until every topic is in the cluster's metadata with a leader for each partition. A topic just
    created can be missing there for a moment (seconds on a broker holding hundreds of topics), and a consumer
    group formed then is given no partitions of it until its next metadata refresh, minutes later (CI: every
    stage of a fresh stack sat with nothing assigned for 180 s)."""
    deadline = time.monotonic() + timeout_s
    pending = set(names)
    while pending:
        topics = admin.list_topics(timeout=10).topics
        pending = {
            n
            for n in pending
            if n not in topics
            or not topics[n].partitions
            or any(p.leader < 0 for p in topics[n].partitions.values())
        }
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"topics without a leader after {timeout_s:.0f}s: {sorted(pending)[:5]}"
            )
        time.sleep(0.2)


def grow_topics(
    bootstrap: str, namespace: str, layout: Layout, topics: tuple[Topic[Any], ...] = TOPICS
) -> dict[str, int]:
    """Raise every topic's partition count to the layout's (Kafka never lowers one); returns {name: new count}
    of the topics grown. Chat-keyed topics all grow to one count, so a chat's events still meet on matching
    partitions. A chat whose key now hashes to a new partition continues there: its turn in flight during the
    change may be handled beside, not after, the one before (docs/decisions/0011-replicated-data-plane.md)."""
    admin = AdminClient(client_config(bootstrap))
    current = admin.list_topics(timeout=10).topics
    wanted = {
        named(t, namespace): layout.partitions(t)
        for t in topics
        if named(t, namespace) in current
        and len(current[named(t, namespace)].partitions) < layout.partitions(t)
    }
    for name, future in (
        admin.create_partitions([NewPartitions(n, c) for n, c in wanted.items()]).items()
        if wanted
        else ()
    ):
        future.result()
        log.info("%s: %d partitions", name, wanted[name])
    return wanted


def dead_letter(
    producer: Producer,
    topic: Topic[Any],
    namespace: str,
    *,
    source: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    error: str,
    stage: str,
) -> None:
    """Park a record that cannot be processed, with where it came from and why, then keep going."""
    headers: list[tuple[str, str | bytes | None]] = [
        ("dlq.source", f"{source}[{partition}]@{offset}".encode()),
        ("dlq.error", error.encode()[:1000]),
        ("dlq.stage", stage.encode()),
    ]
    producer.produce(dead_letter_name(topic, namespace), value=value, key=key, headers=headers)
    producer.flush(10)
    log.warning("dead-lettered %s[%d]@%d: %s", source, partition, offset, error)


class StageProducer:
    """A Kafka producer writing as one stage of one namespace: it refuses a topic the pipeline does not declare
    the stage a producer of (topics/pipeline.check_publish) before anything is encoded or sent."""

    def __init__(self, bootstrap: str, stage: str, namespace: str) -> None:
        self.stage = stage
        self.namespace = namespace
        self.producer = Producer(producer_config(bootstrap))

    def _topic(self, topic: Topic[Any]) -> str:
        check_publish(self.stage, topic)
        return named(topic, self.namespace)

    def _encoded(self, topic: Topic[E], record: E) -> tuple[str, bytes]:
        name = self._topic(topic)
        return name, codec.encode(topic.schema, cast(Event, record))


class Publisher(StageProducer):
    """A blocking producer for tools that write as a stage (a replay writes prompts and tables as the edge does,
    into its own namespace): produce, then flush() waits for the acks."""

    def publish(self, topic: Topic[E], record: E, *, key: str | bytes | None = None) -> None:
        name, value = self._encoded(topic, record)
        self.producer.produce(name, key=key, value=value)
        self.producer.poll(0)

    def flush(self, timeout_s: float) -> int:
        """The records still unacknowledged after timeout_s (0: all written)."""
        return int(self.producer.flush(timeout_s))


class AsyncProducer(StageProducer):
    """confluent-kafka producer for asyncio, publishing as one stage: `await publish(topic, record)` returns once
    the broker has acknowledged.

    The trace context of the caller travels in the record's headers.
    """

    def __init__(self, bootstrap: str, stage: str, namespace: str) -> None:
        super().__init__(bootstrap, stage, namespace)
        self._running = True
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        loop = asyncio.get_running_loop()
        while self._running:
            await loop.run_in_executor(None, self.producer.poll, 0.05)

    async def publish(
        self, topic: Topic[E], record: E, *, key: str | None = None, partition: int = -1
    ) -> None:
        """Encode and send one record and wait for the broker's ack."""
        name, value = self._encoded(topic, record)
        await self._send(name, value, key=key, partition=partition)

    async def tombstone(self, topic: Topic[Any], key: str) -> None:
        """Remove a table row (a compacted topic keeps no record for the key) and wait for the broker's ack."""
        await self._send(self._topic(topic), None, key=key, partition=-1)

    async def _send(
        self, topic: str, value: bytes | None, *, key: str | None, partition: int
    ) -> None:
        loop = asyncio.get_running_loop()
        acked: asyncio.Future[None] = loop.create_future()

        def settle(err: KafkaError | None) -> None:
            if acked.done():
                return
            if err is None:
                acked.set_result(None)
            else:
                acked.set_exception(KafkaException(err))

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            loop.call_soon_threadsafe(settle, err)

        self.producer.produce(
            topic,
            value=value,
            key=key,
            partition=partition,
            headers=tracing.inject(),
            on_delivery=on_delivery,
        )
        await acked

    async def close(self) -> None:
        self._running = False
        if self._task:
            await self._task
        self.producer.flush(10)


def partition_count(bootstrap: str, name: str) -> int:
    """The partitions a topic has, as the cluster says: the settings' count is applied only by `parley topics
    grow`, so code that picks a partition itself asks the cluster (a partition past the end cannot be written)."""
    admin = AdminClient(client_config(bootstrap))
    metadata = until_ready(f"partitions of {name}", lambda: admin.list_topics(name, timeout=10))
    return len(metadata.topics[name].partitions)


def until_ready(what: str, fn: Callable[[], T], timeout_s: float = 60.0) -> T:
    """Call fn until the cluster answers it: right after a broker (re)start, partitions have no leader for a
    few seconds and metadata calls fail with retriable errors."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return fn()
        except KafkaException as exc:
            if time.monotonic() > deadline:
                raise
            log.info(
                "%s: Kafka not ready yet (%s); retrying", what, exc.args[0] if exc.args else exc
            )
            time.sleep(0.5)
