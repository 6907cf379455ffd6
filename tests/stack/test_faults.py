"""Poison records go to dead-letter topics and every stage keeps serving; sinks are idempotent under replay."""

import uuid

from confluent_kafka import Producer

from topics.pipeline import PROMPT_ACCEPTED, PROMPT_MODERATED, RUN_COMPLETED, RUN_REJECTED, RUN_SCHEDULED

from .conftest import BOOTSTRAP, chat_turn, for_run, read_topic, wait_for

POISONED = (PROMPT_ACCEPTED, PROMPT_MODERATED, *RUN_SCHEDULED.values(), RUN_COMPLETED, RUN_REJECTED)


def test_malformed_records_are_dead_lettered_and_the_stages_keep_serving(live):
    marker = uuid.uuid4().hex.encode()
    producer = Producer({"bootstrap.servers": BOOTSTRAP})
    for topic in POISONED:
        producer.produce(live.topic(topic), key=marker, value=b"\x07not avro " + marker)
    producer.flush(10)

    def parked(topic):
        return read_topic(f"{live.topic(topic)}.dlq", lambda m: m.key() == marker, 5)

    for topic in POISONED:
        # Every consuming stage parks its own copy (the edge skips undecodable replies and logs them).
        expected = set(topic.consumers) - {"api"}
        dead = wait_for(lambda t=topic, n=len(expected): len(parked(t)) >= n and parked(t), 60)
        assert dead, f"no dead letter for {topic.name}"
        stages = {dict(m.headers())["dlq.stage"].decode() for m in dead}
        assert stages == expected, (topic.name, stages)
        headers = dict(dead[0].headers())
        assert headers["dlq.source"].decode().startswith(live.topic(topic))
        assert headers["dlq.error"]

    # ... and the pipeline still answers.
    client = live.client(live.token())
    chat = client.post("/v1/chats").json()
    events = chat_turn(client, chat["id"], "Say one word.", max_tokens=8)
    assert events[-1]["event"] == "run.completed"


def test_replayed_run_completed_duplicates_neither_message_nor_usage(live):
    client = live.client(live.token())
    chat = client.post("/v1/chats").json()
    events = chat_turn(client, chat["id"], "Count to three.", max_tokens=12)
    run_id = events[0]["data"]["run_id"]
    completed = read_topic(live.topic(RUN_COMPLETED), for_run("RunCompleted", run_id))
    assert len(completed) == 1
    wait_for(lambda: len(client.get(f"/v1/chats/{chat['id']}/messages").json()["data"]) == 2)

    producer = Producer({"bootstrap.servers": BOOTSTRAP})
    for _ in range(3):  # redelivery / replay of the same event
        producer.produce(live.topic(RUN_COMPLETED), key=completed[0].key(), value=completed[0].value())
    producer.flush(10)

    def replay_seen():
        rows = live.usage_rows(run_id)
        return rows

    # Give both sinks time to process the replays: a fresh run after them must be visible first.
    later = chat_turn(client, chat["id"], "Thanks.", max_tokens=4)
    wait_for(lambda: live.usage_rows(later[0]["data"]["run_id"]), 30)
    wait_for(lambda: len(client.get(f"/v1/chats/{chat['id']}/messages").json()["data"]) == 4)

    messages = client.get(f"/v1/chats/{chat['id']}/messages").json()["data"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert len(replay_seen()) == 1
