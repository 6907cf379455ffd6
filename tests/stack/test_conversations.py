"""The conversation API: list by recent activity, read, rename, delete (with its runs), export."""

import time
import uuid

from cassandra.cluster import Cluster

from replay.client import ChatClient

from .conftest import chat_turn, wait_for


def test_list_is_ordered_by_recent_activity_with_a_cursor(live):
    client = live.client(live.token())
    ids = []
    for i in range(3):
        ids.append(client.post("/v1/chats", json={"title": f"c{i}"}).json()["id"])
        time.sleep(0.01)
    assert [c["id"] for c in client.get("/v1/chats").json()["data"]] == ids[::-1]

    chat_turn(client, ids[0], "Hello again.", max_tokens=4)  # the oldest chat becomes the most recent
    page1 = client.get("/v1/chats", params={"limit": 2}).json()
    assert [c["id"] for c in page1["data"]] == [ids[0], ids[2]]
    assert page1["data"][0]["last_active_at"] > page1["data"][0]["created_at"]
    page2 = client.get("/v1/chats", params={"limit": 2, "cursor": page1["next_cursor"]}).json()
    assert [c["id"] for c in page2["data"]] == [ids[1]] and page2["next_cursor"] is None
    bad = client.get("/v1/chats", params={"cursor": "bm90LWpzb24"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_cursor"


def test_messages_page_with_a_cursor(live):
    client = live.client(live.token())
    chat = client.post("/v1/chats").json()
    for text in ("One.", "Two."):
        chat_turn(client, chat["id"], text, max_tokens=4)
    assert wait_for(lambda: len(client.get(f"/v1/chats/{chat['id']}/messages").json()["data"]) == 4)
    page1 = client.get(f"/v1/chats/{chat['id']}/messages", params={"limit": 3}).json()
    page2 = client.get(f"/v1/chats/{chat['id']}/messages", params={"limit": 3, "cursor": page1["next_cursor"]}).json()
    roles = [m["role"] for m in page1["data"] + page2["data"]]
    assert roles == ["user", "assistant", "user", "assistant"] and page2["next_cursor"] is None
    assert page1["data"][0]["content"] == "One." and page2["data"][0]["role"] == "assistant"


def test_rename_and_ownership(live):
    alice, bob = live.client(live.token()), live.client(live.token())
    chat = alice.post("/v1/chats", json={"title": "before"}).json()
    renamed = alice.patch(f"/v1/chats/{chat['id']}", json={"title": "after"})
    assert renamed.status_code == 200 and renamed.json()["title"] == "after"
    assert alice.get(f"/v1/chats/{chat['id']}").json()["title"] == "after"
    assert alice.get("/v1/chats").json()["data"][0]["title"] == "after"
    assert alice.patch(f"/v1/chats/{chat['id']}", json={"title": ""}).status_code == 400
    for call in (bob.get, bob.delete):
        assert call(f"/v1/chats/{chat['id']}").status_code == 404
    assert bob.patch(f"/v1/chats/{chat['id']}", json={"title": "mine"}).status_code == 404
    assert alice.get(f"/v1/chats/{chat['id']}").json()["title"] == "after"


def test_delete_removes_the_chat_its_messages_and_its_runs(live):
    client = live.client(live.token())
    keep = client.post("/v1/chats", json={"title": "keep"}).json()
    gone = client.post("/v1/chats", json={"title": "gone"}).json()
    events = chat_turn(client, gone["id"], "Say something.", max_tokens=6)
    run_id = events[0]["data"]["run_id"]
    assert wait_for(lambda: len(client.get(f"/v1/chats/{gone['id']}/messages").json()["data"]) == 2)

    assert client.delete(f"/v1/chats/{gone['id']}").status_code == 204
    assert client.get(f"/v1/chats/{gone['id']}").status_code == 404
    assert client.get(f"/v1/chats/{gone['id']}/messages").status_code == 404
    assert client.get(f"/v1/chats/{gone['id']}/runs/{run_id}/events").status_code == 404, "no resume after delete"
    assert client.post(f"/v1/chats/{gone['id']}/runs/{run_id}/cancel").status_code == 404
    assert [c["id"] for c in client.get("/v1/chats").json()["data"]] == [keep["id"]]
    assert client.delete(f"/v1/chats/{gone['id']}").status_code == 404

    # Its messages and their embeddings are erased by the persistence and memory stages, told of the delete.
    session = Cluster(["127.0.0.1"], protocol_version=5).connect()
    ks = f"parley_{live.namespace}".replace("-", "_")

    def left(table):
        query = f"SELECT count(*) FROM {ks}.{table} WHERE chat_id = %s"
        return session.execute(query, (uuid.UUID(gone["id"]),)).one()[0]

    try:
        assert wait_for(lambda: left("messages") == 0 and left("memory") == 0)
        assert left("message_changes") == 0 and left("runs") == 0
    finally:
        session.cluster.shutdown()


def test_a_chat_deleted_while_its_answer_is_written_leaves_nothing_behind(live):
    """Deleted mid-answer, or the moment its answer ends (while the stages store and embed it): the stages are
    told of the delete on another topic than the run's, so they may erase before they write; nothing may stay."""
    client = live.client(live.token())
    chats_api = ChatClient(client)
    chats = []
    for i in range(6):
        chat = client.post("/v1/chats").json()["id"]
        chats.append(chat)
        body = {"content": f"Count to ten, number {i}.", "max_tokens": 24}
        deleted = []

        def delete(_run, chat=chat, deleted=deleted):
            deleted.append(client.delete(f"/v1/chats/{chat}").status_code)  # read on to the end: the run goes on

        # mid-answer, at its first token event (the coalescer may send a short one in one)
        run = chats_api.send(chat, body["content"], max_tokens=body["max_tokens"], then=delete if i % 2 == 0 else None)
        assert run.status == 200
        events = run.events
        assert events[-1]["event"] == "run.completed", events[-1]
        if i % 2:  # the moment it ended
            deleted.append(client.delete(f"/v1/chats/{chat}").status_code)
        assert deleted == [204], (i, deleted)

    session = Cluster(["127.0.0.1"], protocol_version=5).connect()
    ks = f"parley_{live.namespace}".replace("-", "_")

    def left() -> dict:
        counts = {}
        for table in ("messages", "memory", "summaries", "runs", "message_changes"):
            for chat in chats:
                query = f"SELECT count(*) FROM {ks}.{table} WHERE chat_id = %s"
                if n := session.execute(query, (uuid.UUID(chat),)).one()[0]:
                    counts[f"{table} of {chat}"] = n
        return counts

    try:
        time.sleep(3)  # the stages store and embed the last answers
        assert wait_for(lambda: not left(), 60), left()
    finally:
        session.cluster.shutdown()


def test_export_has_every_chat_with_its_messages_and_nothing_of_others(live):
    client, other = live.client(live.token()), live.client(live.token())
    first = client.post("/v1/chats", json={"title": "first"}).json()
    client.post("/v1/chats", json={"title": "empty"})
    other.post("/v1/chats", json={"title": "not mine"})
    chat_turn(client, first["id"], "Export me.", max_tokens=4)
    assert wait_for(lambda: len(client.get(f"/v1/chats/{first['id']}/messages").json()["data"]) == 2)

    export = client.get("/v1/chats/export")
    assert export.status_code == 200
    body = export.json()
    assert sorted(c["title"] for c in body["chats"]) == ["empty", "first"]
    exported = next(c for c in body["chats"] if c["id"] == first["id"])
    assert [m["role"] for m in exported["messages"]] == ["user", "assistant"]
    assert exported["messages"][0]["content"] == "Export me."


def test_regenerate_and_feedback_are_for_the_latest_finished_answer_of_ones_own_chat(live):
    token = live.token()
    with live.client(token) as client, live.client(live.token()) as stranger:
        chat = client.post("/v1/chats").json()["id"]
        first = chat_turn(client, chat, "Say hi.", max_tokens=8)[0]["data"]["run_id"]
        second = chat_turn(client, chat, "Say bye.", max_tokens=8)[0]["data"]["run_id"]
        assert wait_for(lambda: client.get(f"/v1/chats/{chat}").json()["active_run_id"] is None)

        stale = client.post(f"/v1/chats/{chat}/runs/{first}/regenerate")
        assert stale.status_code == 409 and stale.json()["error"]["code"] == "not_latest_run"
        foreign = stranger.post(f"/v1/chats/{chat}/runs/{second}/regenerate")
        assert foreign.status_code == 404

        stored = wait_for(lambda: len(m := client.get(f"/v1/chats/{chat}/messages").json()["data"]) == 4 and m)
        question = next(m for m in stored if m["role"] == "user")
        wrong = client.post(f"/v1/chats/{chat}/messages/{question['id']}/feedback", json={"rating": "up"})
        assert wrong.status_code == 400
        bad = client.post(f"/v1/chats/{chat}/messages/{second}/feedback", json={"rating": "sideways"})
        assert bad.status_code == 400 and "error" in bad.json()
        assert stranger.post(f"/v1/chats/{chat}/messages/{second}/feedback", json={"rating": "up"}).status_code == 404

        def feedback_of(message_id):
            return next(m for m in client.get(f"/v1/chats/{chat}/messages").json()["data"] if m["id"] == message_id)[
                "feedback"
            ]

        for rating in ("down", None):  # rated, then taken back
            rated = client.post(f"/v1/chats/{chat}/messages/{second}/feedback", json={"rating": rating})
            assert rated.status_code == 202
            assert wait_for(lambda rating=rating: feedback_of(second) == rating)
