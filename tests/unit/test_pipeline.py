"""The pipeline declaration is consistent: every topic has a schema, one producer, known consumers."""

import re

from topics import codec
from topics.pipeline import CHAT, REPLY, SINGLE, STAGES, TOPICS, Layout, dead_letter_name, named


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


def test_conversation_topics_share_one_partition_count_and_reply_topics_follow_the_edge():
    keyed = [t for t in TOPICS if t.key == "chat_id"]
    assert keyed and all(t.scale == CHAT for t in keyed)
    assert {t.scale for t in TOPICS if t.key == "reply_partition"} == {REPLY}
    layout = Layout(chat_partitions=7, reply_partitions=9)
    assert {layout.partitions(t) for t in keyed} == {7}
    assert {layout.partitions(t) for t in TOPICS if t.scale == REPLY} == {9}
    assert {layout.partitions(t) for t in TOPICS if t.scale == SINGLE} == {1}


def test_every_topic_is_durable_by_its_layout():
    """Production defaults: 3 copies, 2 in sync before an ack, no unclean election; a table keeps compaction."""
    layout = Layout()
    assert (layout.replication_factor, layout.min_insync_replicas) == (3, 2)
    for topic in TOPICS:
        config = layout.config(topic)
        assert config["min.insync.replicas"] == "2" and config["unclean.leader.election.enable"] == "false"
        assert all(config[k] == v for k, v in topic.config)
    assert Layout(replication_factor=1, min_insync_replicas=1).config()["min.insync.replicas"] == "1"


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


def test_keyspace_replication_is_one_count_per_datacenter_from_settings():
    from storage.cassandra import replication
    from topics.settings import StackSettings

    production = StackSettings()
    assert production.cassandra.consistency == "LOCAL_QUORUM"
    assert production.cassandra.serial_consistency == "LOCAL_SERIAL"
    assert replication(production.cassandra) == {
        "class": "org.apache.cassandra.locator.NetworkTopologyStrategy",
        "datacenter1": "3",
    }
    two_dcs = StackSettings(cassandra_replication={"eu": 3, "us": 2}, cassandra_hosts="a, b").cassandra
    assert replication(two_dcs)["eu"] == "3" and replication(two_dcs)["us"] == "2" and two_dcs.hosts == ("a", "b")
