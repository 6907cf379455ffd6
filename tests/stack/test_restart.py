"""Conversations and usage survive a restart of the whole stack (Kafka, Cassandra, chdb, every stage)."""

from infra.processes import LOCAL, sh

from .conftest import chat_turn, wait_for


def test_turns_and_usage_survive_a_full_restart(live):
    client = live.client(live.token())
    chat = client.post("/v1/chats", json={"title": "keep me"}).json()
    events = chat_turn(client, chat["id"], "Remember the number seven.", max_tokens=12)
    run_id = events[0]["data"]["run_id"]
    assert wait_for(lambda: live.usage_rows(run_id))
    assert wait_for(lambda: len(client.get(f"/v1/chats/{chat['id']}/messages").json()["data"]) == 2)

    live.stack.stop()
    sh(LOCAL / "cassandra.sh", "restart")
    sh(LOCAL / "kafka.sh", "restart")
    live.stack.start()
    live.stack.wait_ready()

    data = client.get(f"/v1/chats/{chat['id']}/messages").json()["data"]
    assert [m["role"] for m in data] == ["user", "assistant"]
    assert data[0]["content"] == "Remember the number seven."
    assert data[1]["id"] == run_id
    rows = live.usage_rows(run_id)
    assert len(rows) == 1 and int(rows[0]["completion_tokens"]) == events[-1]["data"]["usage"]["completion_tokens"]
    # and the restarted pipeline serves a new turn carrying the old one
    again = chat_turn(client, chat["id"], "What number?", max_tokens=8)
    assert again[-1]["event"] == "run.completed"
