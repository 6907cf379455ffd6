"""Every record names the schema that wrote it (the registry's wire format), on the real registry service.

Standard Kafka tooling reads our topics; the registry refuses an incompatible schema; a record written with a
released (older) schema is answered by today's stages; an unknown schema id is dead-lettered with the reason;
while the registry is down, producers go on with the ids they hold and a lookup fails clearly."""

import io
import json
import os
import signal
import struct
import time
import uuid

import fastavro
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from registry.client import HttpRegistry
from storage.ids import new_id
from topics import codec
from topics.errors import RetriableError
from topics.pipeline import PROMPT_ACCEPTED, RUN_COMPLETED

from .conftest import BOOTSTRAP, chat_turn, for_run, read_topic, wait_for


def test_records_carry_their_writer_schema_id_and_standard_tools_read_them(live):
    client = live.client(live.token())
    chat = client.post("/v1/chats").json()
    run_id = chat_turn(client, chat["id"], "Name a colour.", max_tokens=8)[0]["data"]["run_id"]
    [record] = read_topic(live.topic(RUN_COMPLETED), for_run("RunCompleted", run_id))
    payload = record.value()
    assert payload[0] == 0
    schema_id = struct.unpack(">I", payload[1:5])[0]
    registry = SchemaRegistryClient({"url": live.stack.registry_url})
    assert json.loads(registry.get_schema(schema_id).schema_str)["name"] == "RunCompleted"
    assert registry.get_latest_version("parley.events.RunCompleted").schema_id == schema_id
    context = SerializationContext(live.topic(RUN_COMPLETED), MessageField.VALUE)
    value = AvroDeserializer(registry)(payload, context)  # Confluent's own deserializer, not our codec
    assert value["prompt"]["run_id"] == run_id and value["prompt"]["chat_id"] == chat["id"]


def test_the_registry_refuses_a_backward_incompatible_schema(live):
    registry = SchemaRegistryClient({"url": live.stack.registry_url})
    subject = f"test-{uuid.uuid4().hex[:8]}.RunCompleted"
    base = json.loads(codec.expanded("RunCompleted"))
    first = registry.register_schema(subject, Schema(json.dumps(base), "AVRO"))
    optional = {**base, "fields": [*base["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}
    required = {**base, "fields": [*base["fields"], {"name": "needed", "type": "string"}]}
    assert registry.test_compatibility(subject, Schema(json.dumps(optional), "AVRO"))
    assert not registry.test_compatibility(subject, Schema(json.dumps(required), "AVRO"))
    with pytest.raises(SchemaRegistryError) as refused:
        registry.register_schema(subject, Schema(json.dumps(required), "AVRO"))
    assert refused.value.http_status_code == 409 and "needed" in refused.value.error_message
    assert registry.register_schema(subject, Schema(json.dumps(optional), "AVRO")) != first
    assert registry.get_versions(subject) == [1, 2]


def test_a_prompt_written_with_the_released_schema_is_answered_by_todays_stages(live):
    """A rolling deploy's old producer, or a replay of an old log: PromptAccepted as first released."""
    token = live.token()
    client = live.client(token)
    chat = client.post("/v1/chats").json()
    user = client.get("/v1/me").json()["user_id"]
    writer = codec.expanded("PromptAccepted", codec.SCHEMA_DIR / "released")
    registry = SchemaRegistryClient({"url": live.stack.registry_url})
    schema_id = registry.register_schema(f"test-{uuid.uuid4().hex[:8]}.PromptAccepted", Schema(writer, "AVRO"))
    message_id = str(new_id())  # the question's id comes first: messages are ordered by id
    run_id = str(new_id())
    old = {
        "event_id": str(uuid.uuid4()),
        "run_id": run_id,
        "chat_id": chat["id"],
        "user_id": user,
        "tier": "pro",
        "message_id": message_id,
        "content": "Say hello in one short sentence.",
        "max_tokens": 12,
        "model": None,
        "reply_partition": 0,
        "prev_run_id": None,
        "created_at": int(time.time() * 1000),
    }
    buf = io.BytesIO()
    buf.write(struct.pack(">bI", 0, schema_id))
    fastavro.schemaless_writer(buf, fastavro.parse_schema(json.loads(writer)), old)
    producer = Producer({"bootstrap.servers": BOOTSTRAP})
    producer.produce(live.topic(PROMPT_ACCEPTED), key=chat["id"], value=buf.getvalue())
    producer.flush(10)

    def answered():
        data = client.get(f"/v1/chats/{chat['id']}/messages").json()["data"]
        return data if len(data) == 2 else None

    messages = wait_for(answered, 90)
    assert messages, "today's stages did not answer a record written with the released schema"
    assert messages[0]["content"] == old["content"] and messages[1]["id"] == run_id
    [done] = [
        codec.decode("RunCompleted", m.value())
        for m in read_topic(live.topic(RUN_COMPLETED), for_run("RunCompleted", run_id))
    ]
    assert done["prompt"]["store"] is True and done["prompt"]["messages"] is None  # defaults of fields added since


def test_an_unknown_schema_id_is_dead_lettered_with_the_reason(live):
    marker = uuid.uuid4().hex.encode()
    producer = Producer({"bootstrap.servers": BOOTSTRAP})
    producer.produce(live.topic(PROMPT_ACCEPTED), key=marker, value=struct.pack(">bI", 0, 2_147_483_000) + b"\x02x")
    producer.flush(10)
    dlq = f"{live.topic(PROMPT_ACCEPTED)}.dlq"
    dead = wait_for(lambda: read_topic(dlq, lambda m: m.key() == marker, 5), 60)
    assert dead, "not dead-lettered"
    assert "unknown schema id 2147483000" in dict(dead[0].headers())["dlq.error"].decode()


def test_while_the_registry_is_down_producers_go_on_and_a_lookup_fails_clearly(live):
    # An edge replica that has read no reply since it started (a restart, a scale-out) reads them all the same:
    # a process keeps the schemas it registered as the writers of their ids (CI met one that had to ask).
    os.killpg(live.stack.pids()["api-0"], signal.SIGKILL)
    wait_for(lambda: "api-0" not in live.stack.pids(), 10)
    live.stack.start()
    live.stack.wait_ready()
    pid = live.stack.pids()["schema-registry"]
    os.killpg(pid, signal.SIGKILL)
    try:
        wait_for(lambda: "schema-registry" not in live.stack.pids(), 10)
        client = live.client(live.token())
        chat = client.post("/v1/chats").json()
        events = chat_turn(client, chat["id"], "Say one word.", max_tokens=8)
        assert events[-1]["event"] == "run.completed", events  # every stage kept producing on the ids it holds
        fresh = codec.Schemas(HttpRegistry(live.stack.registry_url), retry_s=1.0)
        with pytest.raises(RetriableError, match="schema registry unreachable"):
            fresh.writer(codec.registry().id_for("RunCompleted"))
    finally:
        live.stack.start()
        live.stack.wait_ready()
    assert fresh.writer(codec.registry().id_for("RunCompleted"))  # back, from its replicated topic
