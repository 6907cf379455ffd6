"""The pipeline declaration is consistent (every topic has a schema, known producers and consumers) and it is
the code's: the producers it lists are the stages whose code publishes there, and nothing else may publish; the
consumers it lists are the stages that read there, and nothing else may read."""

import ast
import asyncio
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

from runtime.settings import Periods, StackSettings
from topics import codec, pipeline
from topics.pipeline import (
    AUDIT,
    CHAT,
    LIMITS,
    POOL_STATUS,
    PROMPT_ACCEPTED,
    REPLY,
    RUN_COMPLETED,
    RUN_SCHEDULED,
    SINGLE,
    STAGES,
    TOKEN_DELTA,
    TOPICS,
    Layout,
    UndeclaredConsume,
    UndeclaredPublish,
    check_consume,
    dead_letter_name,
    named,
)

ROOT = Path(__file__).resolve().parents[2]
# Where each process's code lives, from its declared module: what it publishes is read from there.
STAGE_CODE = {p.name: [p.module.replace(".", "/") + (".py" if "." in p.module else "")] for p in pipeline.PROCESSES}
STAGE_CODE["api"].append("runtime/keys.py")  # the edge's keyring makes and deletes people's data keys


def test_every_topic_has_a_schema_and_known_producers():
    schemas = codec.schemas()
    for topic in TOPICS:
        assert topic.schema in schemas, topic.name
        assert topic.producers and set(topic.producers) <= set(STAGES), topic.name
        assert topic.consumers and set(topic.consumers) <= set(STAGES), topic.name
        assert set(topic.readers) <= set(STAGES), topic.name
        # A stage reads what it writes only as a table's writer reading its rows back (the edge's admin reads),
        # or as a reader tailing placements (the scheduler's replicas see each other's).
        assert not set(topic.producers) & set(topic.consumers) or topic.scale == SINGLE, topic.name
        assert not topic.readers or topic.scale != SINGLE, topic.name


def _topics_named(node: ast.AST) -> set[str]:
    """The pipeline topics an expression names: TOPIC, or RUN_SCHEDULED[...] (every pool's)."""
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Name) and hasattr(pipeline, node.id):
        value = getattr(pipeline, node.id)
        if isinstance(value, pipeline.Topic):
            return {value.name}
        if isinstance(value, dict) and value and all(isinstance(t, pipeline.Topic) for t in value.values()):
            return {t.name for t in value.values()}
    return set()


def _published(paths: list[str]) -> set[str]:
    """Every topic the code publishes to: the topic argument of each publish(...) call. One that names no
    pipeline topic, unless it is inside a `publish` wrapper whose callers name it, fails the test (the
    declaration could not be checked against it)."""
    found: set[str] = set()
    files = [f for p in paths for f in ((ROOT / p).rglob("*.py") if (ROOT / p).is_dir() else [ROOT / p])]
    for file in files:
        tree = ast.parse(file.read_text())
        wrappers = [
            n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef) and n.name == "publish"
        ]
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) != "publish":
                continue
            topics = set().union(*(_topics_named(a) for a in (*node.args, *(k.value for k in node.keywords))))
            inside = any(w.lineno <= node.lineno <= (w.end_lineno or w.lineno) for w in wrappers)
            assert topics or inside, f"{file}:{node.lineno}: publish() names no pipeline topic"
            found |= topics
    return found


@pytest.mark.parametrize("stage", STAGES)
def test_the_declared_producers_of_each_topic_are_the_stages_whose_code_publishes_there(stage):
    declared = {t.name for t in TOPICS if stage in t.producers}
    assert _published(STAGE_CODE[stage]) == declared


@pytest.mark.parametrize("stage", pipeline.FAUST_STAGES)
def test_the_declared_consumers_of_each_stream_are_the_topics_of_the_stages_handlers(stage):
    """A faust stage's HANDLERS name exactly the stream topics declaring it a consumer (the tables it reads are
    views, checked as they are built: test below), each once."""
    handlers = importlib.import_module(pipeline.process(stage).module).HANDLERS
    consumed = [h.topic.name for h in handlers]
    assert len(consumed) == len(set(consumed))
    assert set(consumed) == {t.name for t in TOPICS if stage in t.consumers and t.scale != SINGLE}


def test_every_process_is_declared_once_with_its_own_port():
    names = [p.name for p in pipeline.PROCESSES]
    assert len(names) == len(set(names)) == len(STAGES)
    ports = [p.port for p in pipeline.PROCESSES if p.port]
    assert len(ports) == len(set(ports)) == len(pipeline.FAUST_STAGES)
    for p in pipeline.PROCESSES:
        assert importlib.util.find_spec(p.module) is not None, p.module
    with pytest.raises(KeyError, match="no process 'nope'"):
        pipeline.process("nope")


def test_reading_a_topic_the_stage_does_not_consume_fails_before_connecting():
    from admission.limits import LimitsView
    from admission.placement import PoolView
    from processors.settings import ProcessorSettings
    from processors.stage import Stage

    with pytest.raises(UndeclaredConsume, match="metering may not read admin.limits.v1"):
        LimitsView("127.0.0.1:9", "t", "metering")
    with pytest.raises(UndeclaredConsume, match="inference may not read chat.pool-status.v1"):
        PoolView("127.0.0.1:9", "t", "inference")
    with pytest.raises(UndeclaredConsume, match="memory may not read chat.run-scheduled-small.v1: its readers"):
        check_consume("memory", RUN_SCHEDULED["small"], tailing=True)
    stage = Stage("metering", ProcessorSettings(kafka_bootstrap="127.0.0.1:9", namespace="t"))
    with pytest.raises(UndeclaredConsume, match="metering may not read chat.prompt-accepted.v1"):
        stage.consume(PROMPT_ACCEPTED, lambda _event: asyncio.sleep(0))


def test_publishing_to_a_topic_the_stage_does_not_produce_fails_in_both_kafka_clients():
    """The edge's and the inference consumers' producer (confluent-kafka) and the faust stages' shell refuse
    before anything is sent (nothing listens on the bootstrap address)."""
    from processors.settings import ProcessorSettings
    from processors.stage import Stage
    from runtime.kafka import AsyncProducer

    async def attempts() -> None:
        edge = AsyncProducer("127.0.0.1:9", "api", "t")
        with pytest.raises(UndeclaredPublish, match="api may not publish to chat.run-completed.v1"):
            await edge.publish(RUN_COMPLETED, {})
        worker = AsyncProducer("127.0.0.1:9", "inference", "t")
        with pytest.raises(UndeclaredPublish):
            await worker.publish(LIMITS, None, key="tier:free")
        stage = Stage("moderation", ProcessorSettings(kafka_bootstrap="127.0.0.1:9", namespace="t"))
        with pytest.raises(UndeclaredPublish, match="moderation may not publish to chat.prompt-accepted.v1"):
            await stage.publish(PROMPT_ACCEPTED, {})

    asyncio.run(attempts())


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
    produced = {p for t in TOPICS for p in t.producers}
    assert set(STAGES) == consumed | produced
    assert {"moderation", "scheduling", "inference", "persistence", "metering", "api"} <= consumed


def test_namespacing_and_dead_letter_names():
    topic = TOPICS[0]
    assert named(topic, "") == topic.name
    assert named(topic, "t1") == f"t1.{topic.name}"
    assert dead_letter_name(topic, "t1") == f"t1.{topic.name}.dlq"


def test_keyspace_replication_is_one_count_per_datacenter_from_settings():
    from runtime.settings import StackSettings
    from storage.session import replication

    production = StackSettings()
    assert production.cassandra.consistency == "LOCAL_QUORUM"
    assert production.cassandra.serial_consistency == "LOCAL_SERIAL"
    assert replication(production.cassandra) == {
        "class": "org.apache.cassandra.locator.NetworkTopologyStrategy",
        "datacenter1": "3",
    }
    two_dcs = StackSettings(cassandra_replication={"eu": 3, "us": 2}, cassandra_hosts="a, b").cassandra
    assert replication(two_dcs)["eu"] == "3" and replication(two_dcs)["us"] == "2" and two_dcs.hosts == ("a", "b")


def test_every_topic_but_tables_and_pool_status_is_kept_for_a_period_of_the_settings():
    """The log's retention comes from the settings' periods (docs/privacy.md): a conversation's topics and their
    dead letters the events period, the deltas and commands the stream period, the audit record its own; 0
    days is Kafka's -1 (kept until deleted). The layout's own defaults are the settings' defaults."""
    assert StackSettings().layout == Layout(replication_factor=3, min_insync_replicas=2)
    days = {"events": 2.5, "stream": 0.5, "audit": 0.0}
    layout = StackSettings(**{f"retain_{k}_days": v for k, v in days.items()}).layout
    kept = {t.name: layout.config(t).get("retention.ms") for t in TOPICS}
    assert kept[PROMPT_ACCEPTED.name] == kept[RUN_COMPLETED.name] == str(int(2.5 * 86_400_000))
    assert kept[TOKEN_DELTA.name] == str(43_200_000) and kept[AUDIT.name] == "-1"
    assert layout.config()["retention.ms"] == kept[PROMPT_ACCEPTED.name]  # a dead-letter topic
    assert kept[POOL_STATUS.name] == "3600000" and kept[LIMITS.name] is None
    assert layout.config(LIMITS)["cleanup.policy"] == "compact"
    assert {t.kept for t in TOPICS if t.key == "chat_id"} == {"events"}
    with pytest.raises(ValueError):
        StackSettings(retain_usage_days=-1)
    assert Periods(safety=1 / 86_400).seconds("safety") == 1 and Periods(usage=0).seconds("usage") == 0
