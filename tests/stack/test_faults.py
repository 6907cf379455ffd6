"""Poison records go to dead-letter topics and every stage keeps serving; sinks are idempotent under replay."""

import asyncio
import time
import uuid

from cassandra.cluster import Cluster
from confluent_kafka import Producer

from runtime.kafka import Publisher
from storage.conversations import Conversations
from storage.ids import new_id
from storage.withdrawals import SUSPECT_AFTER_MS, TAKEN, WITHDRAWN
from topics import codec
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


def test_a_prompt_the_edge_gave_up_on_is_served_only_when_the_scheduler_took_it_first(live):
    """A prompt whose publish the edge saw time out may be in the log all the same (a broker killed after it
    appended the record). Two such prompts reach the stages late, as after the broker's restart: the one the
    edge withdrew first (it answered 503) leaves nothing, neither answer nor question; the other the scheduler
    takes, serves and stores, and the edge's withdrawal then finds it taken (storage/withdrawals.py)."""
    client = live.client(live.token())
    chat = client.post("/v1/chats").json()["id"]
    run0 = chat_turn(client, chat, "Say one word.", max_tokens=4)[0]["data"]["run_id"]
    [record] = read_topic(live.topic(PROMPT_ACCEPTED), for_run("PromptAccepted", run0))
    prompt = codec.decode("PromptAccepted", record.value())

    def messages() -> list[dict]:
        return client.get(f"/v1/chats/{chat}/messages").json()["data"]

    assert wait_for(lambda: len(messages()) == 2)
    session = Cluster(["127.0.0.1"], protocol_version=5).connect()
    edge = Conversations(session, f"parley_{live.namespace}".replace("-", "_"), "api")
    try:
        withdrawn, taken = new_id(), new_id()
        for run in (withdrawn, taken):  # each as the edge opens one: on the chat as it reads it then
            chat_row = asyncio.run(edge.get_chat(uuid.UUID(chat)))
            asyncio.run(edge.open_run(chat_row, run, prompt["reply_partition"]))
        assert asyncio.run(edge.settle_fate(chat_row.chat_id, withdrawn, WITHDRAWN)) == WITHDRAWN
        late = int(time.time() * 1000) - SUSPECT_AFTER_MS - 5_000
        publisher = Publisher(BOOTSTRAP, "api", live.namespace)
        for run, text in ((withdrawn, "The withdrawn question."), (taken, "The taken question.")):
            # as the edge sends a chat's next message: after the first answer, on its branch
            event = {**prompt, "event_id": str(uuid.uuid4()), "run_id": str(run), "message_id": str(new_id()),
                     "parent_id": run0, "prev_run_id": run0}  # fmt: skip
            publisher.publish(PROMPT_ACCEPTED, {**event, "content": text, "created_at": late}, key=chat)
        assert publisher.flush(10) == 0

        assert wait_for(lambda: read_topic(live.topic(RUN_COMPLETED), for_run("RunCompleted", str(taken)), 5), 90)
        [refusal] = read_topic(live.topic(RUN_REJECTED), for_run("RunRejected", str(withdrawn)))
        assert codec.decode("RunRejected", refusal.value())["code"] == WITHDRAWN
        assert not read_topic(live.topic(RUN_COMPLETED), for_run("RunCompleted", str(withdrawn)), 5)

        def stored() -> list[tuple[str, str | None]]:
            return [(m["role"], m["run_id"]) for m in messages()[2:]]

        expected = [("user", str(taken)), ("assistant", str(taken))]
        assert wait_for(lambda: sorted(stored()) == sorted(expected), 60), stored()
        # the edge, its publish timed out only now, finds the run taken: it streams it instead of a 503
        assert asyncio.run(edge.settle_fate(chat_row.chat_id, taken, WITHDRAWN)) == TAKEN
    finally:
        session.cluster.shutdown()
