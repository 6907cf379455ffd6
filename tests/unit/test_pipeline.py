"""The pipeline declaration is consistent: every topic has a schema, one producer, known consumers."""

import re

from topics import codec
from topics.pipeline import CHAT_PARTITIONS, STAGES, TOPICS, dead_letter_name, named


def test_every_topic_has_a_schema_and_exactly_one_known_producer():
    schemas = codec.schemas()
    for topic in TOPICS:
        assert topic.schema in schemas, topic.name
        assert isinstance(topic.producer, str) and topic.producer in STAGES, topic.name
        assert topic.consumers and set(topic.consumers) <= set(STAGES), topic.name
        assert topic.producer not in topic.consumers, topic.name


def test_topic_names_follow_domain_event_version():
    for topic in TOPICS:
        assert re.fullmatch(r"[a-z]+\.[a-z-]+\.v\d+", topic.name), topic.name
    assert len({t.name for t in TOPICS}) == len(TOPICS)


def test_conversation_topics_share_one_partition_count():
    keyed = [t for t in TOPICS if t.key == "chat_id"]
    assert keyed and all(t.partitions == CHAT_PARTITIONS for t in keyed)


def test_every_stage_but_the_edge_consumes_something_and_the_flow_is_connected():
    consumed = {c for t in TOPICS for c in t.consumers}
    produced = {t.producer for t in TOPICS}
    assert set(STAGES) == consumed | produced
    assert {"moderation", "scheduling", "inference", "persistence", "metering", "api"} <= consumed


def test_namespacing_and_dead_letter_names():
    topic = TOPICS[0]
    assert named(topic, "") == topic.name
    assert named(topic, "t1") == f"t1.{topic.name}"
    assert dead_letter_name(topic, "t1") == f"t1.{topic.name}.dlq"
