"""Retention from the settings' periods, on the real Kafka and Cassandra (docs/privacy.md): a topic keeps its
records for its period and the broker then deletes them, a changed period reaches topics already made; a
Cassandra table's rows expire their period after they are written. ClickHouse's TTLs: tests/unit/test_usage.py."""

import asyncio
import dataclasses
import uuid
from datetime import UTC, datetime

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from runtime.kafka import delete_topics, ensure_topics
from runtime.settings import Periods
from storage import decisions, responses
from storage.decisions import SafetyDecision, SafetyDecisions
from storage.schema import expire_by_period
from storage.session import connect_session, ensure_keyspace
from topics.pipeline import FEEDBACK, LIMITS, TOKEN_DELTA, dead_letter_name, named

from .conftest import BOOTSTRAP, wait_for


def retention_ms(admin: AdminClient, name: str) -> str:
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    return admin.describe_configs([resource])[resource].result(timeout=30)["retention.ms"].value


def low_watermark(name: str) -> int:
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": f"test-{uuid.uuid4().hex}"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(name, 0), timeout=10)[0]
    finally:
        consumer.close()


def test_topics_keep_records_their_period_then_the_broker_deletes_them_and_a_changed_period_applies(live):
    namespace = f"kept{uuid.uuid4().hex[:8]}"
    seconds = Periods(events=2 / 86_400, stream=3600 / 86_400, audit=0)
    layout = dataclasses.replace(
        live.stack.settings.layout,
        chat_partitions=1,
        retention_ms=tuple((k, seconds.kafka_ms(k)) for k in ("events", "stream", "audit")),
    )
    topics = (FEEDBACK, TOKEN_DELTA, LIMITS)
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    try:
        ensure_topics(BOOTSTRAP, namespace, layout, topics)
        feedback, deltas = named(FEEDBACK, namespace), named(TOKEN_DELTA, namespace)
        assert retention_ms(admin, feedback) == "2000" == retention_ms(admin, dead_letter_name(FEEDBACK, namespace))
        assert retention_ms(admin, deltas) == "3600000"
        producer = Producer({"bootstrap.servers": BOOTSTRAP})
        for name in (feedback, deltas):
            for i in range(3):
                producer.produce(name, f"planted {i}".encode(), partition=0)
        assert producer.flush(30) == 0
        # The broker looks every few seconds locally (log.retention.check.interval.ms, infra/local/kafka.sh;
        # 5 minutes by default): once the newest record of a segment is older than the period, it goes.
        assert wait_for(lambda: low_watermark(feedback) == 3, timeout_s=60), "the events' period did not delete"
        assert low_watermark(deltas) == 0  # within its hour

        shorter = dataclasses.replace(layout, retention_ms=(("events", 2000), ("stream", 2000), ("audit", -1)))
        ensure_topics(BOOTSTRAP, namespace, shorter, topics)  # the settings changed: the topic already made follows
        assert retention_ms(admin, deltas) == "2000"
        assert wait_for(lambda: low_watermark(deltas) == 3, timeout_s=60), "a shortened period did not reach the log"
    finally:
        delete_topics(BOOTSTRAP, namespace)


def test_safety_decisions_and_stored_responses_expire_their_period_after_they_are_written(live):
    settings = dataclasses.replace(live.stack.settings.cassandra, keyspace=f"kept_{uuid.uuid4().hex[:8]}")
    session = connect_session(settings)
    try:
        ensure_keyspace(session, settings)
        for store in (decisions, responses):
            store.create_schema(session, settings.keyspace)
        assert expire_by_period(session, settings) == {
            "safety_decisions": 90 * 86_400,
            "responses": 30 * 86_400,
            "responses_by_user": 30 * 86_400,  # a person's index of them, kept as long
        }
        assert expire_by_period(session, settings) == {}  # unchanged periods: no schema change

        store = SafetyDecisions(session, settings.keyspace, "persistence")

        def decided(excerpt: str) -> SafetyDecision:
            at, who = datetime.now(UTC), ("r", "c", "ann", "pro")
            return SafetyDecision(uuid.uuid1(), at, "input", "block", "violence", 0.9, "v1", *who, excerpt)

        asyncio.run(store.put(decided("before the change")))
        two_seconds = dataclasses.replace(settings, periods=Periods(safety=2 / 86_400))
        assert expire_by_period(session, two_seconds)["safety_decisions"] == 2
        asyncio.run(store.put(decided("after the change")))

        def excerpts() -> set[str]:
            return {d.excerpt for d in asyncio.run(store.recent(10, days=1))}

        assert excerpts() == {"before the change", "after the change"}
        # A row written after the change expires 2 s later; one written before keeps the TTL it was written with
        assert wait_for(lambda: excerpts() == {"before the change"}, timeout_s=10)
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=60)
        session.cluster.shutdown()
