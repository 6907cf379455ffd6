"""Durable, resumable streams: the SSE id is a cursor into the Kafka log, served by any edge replica."""

import os
import random
import signal
import threading

from replay.client import ChatClient

from ..sse import shown
from .conftest import chat_turn, wait_for


def replay(client, chat_id, run_id, last_event_id=None):
    run = ChatClient(client).resume(chat_id, run_id, last_event_id)
    assert run.status == 200, run.error
    return run.events


def offsets(events):
    return [int(e["id"].split(":")[2]) for e in events]


def test_a_finished_run_replays_whole_and_identical_on_another_replica(live):
    token = live.token()
    edge0, edge1 = live.client(token, 0), live.client(token, 1)
    chat = edge0.post("/v1/chats").json()
    original = chat_turn(edge0, chat["id"], "Name two colours.", max_tokens=16)
    run_id = original[0]["data"]["run_id"]
    assert replay(edge1, chat["id"], run_id) == original
    assert replay(edge0, chat["id"], run_id) == original


def test_a_dropped_stream_resumes_on_another_replica_with_no_gap_and_no_duplicate(live):
    token = live.token()
    edge0, edge1 = live.client(token, 0), live.client(token, 1)
    chat = edge0.post("/v1/chats").json()

    story = "Write a long story about a lighthouse keeper."
    # read a few events, then drop the connection mid-answer
    dropped = ChatClient(edge0).send(
        chat["id"], story, max_tokens=160, when=lambda r: r.tokens >= 3, then=lambda _: True
    )
    assert dropped.status == 200
    first_part = dropped.events
    assert [e["event"] for e in first_part[:2]] == ["run.queued", "run.started"]
    run_id = first_part[0]["data"]["run_id"]

    # a second device watches the whole run at the same time
    whole = {}
    watcher = threading.Thread(target=lambda: whole.setdefault("events", replay(edge0, chat["id"], run_id)))
    watcher.start()
    rest = replay(edge1, chat["id"], run_id, last_event_id=first_part[-1]["id"])
    watcher.join(120)

    combined = first_part + rest
    ids = offsets(combined)
    assert ids == sorted(set(ids)), "no duplicate and in log order"
    assert rest and rest[-1]["event"] == "run.completed", "closing the tab did not cancel the run"
    assert whole["events"] == combined, "the second device saw exactly the same stream"
    text = shown(combined)

    def persisted():
        data = edge1.get(f"/v1/chats/{chat['id']}/messages").json()["data"]
        return data[1]["content"] if len(data) == 2 else None

    assert wait_for(persisted) == text, "no gap: the resumed text is the whole answer"


def test_resume_errors(live):
    alice, bob = live.client(live.token("alice-r")), live.client(live.token("bob-r"))
    chat = alice.post("/v1/chats").json()
    events = chat_turn(alice, chat["id"], "Hi", max_tokens=4)
    run_id = events[0]["data"]["run_id"]
    url = f"/v1/chats/{chat['id']}/runs/{run_id}/events"
    partition = int(events[-1]["id"].split(":")[1])  # "t:<partition>:<offset>"
    elsewhere = f"t:{partition + 1}:1"  # a cursor of another partition than the run's
    for bad in ("garbage", elsewhere, "x:0:1", "t:-1:2"):
        response = alice.get(url, headers={"Last-Event-ID": bad})
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_last_event_id", bad
    assert bob.get(url).status_code == 404
    other = alice.post("/v1/chats").json()
    assert alice.get(f"/v1/chats/{other['id']}/runs/{run_id}/events").status_code == 404
    assert alice.get(f"/v1/chats/{chat['id']}/runs/not-a-run/events").status_code == 404
    # resuming after the terminal event yields nothing more
    assert replay(alice, chat["id"], run_id, last_event_id=events[-1]["id"]) == []


def test_kill_9_of_the_edge_mid_stream_resumes_on_another_replica_byte_identical(live):
    token = live.token()
    edge0, edge1 = live.client(token, 0), live.client(token, 1)
    chat = edge1.post("/v1/chats").json()
    victim = live.stack.pids()["api-1"]
    stop_at = random.randint(1, 6)  # a random token
    story = "Write a long story about a lighthouse keeper."
    # kill the edge at a random token, then read on until the stream breaks
    killed = ChatClient(edge1).send(
        chat["id"],
        story,
        max_tokens=120,
        when=lambda r: r.tokens >= stop_at,
        then=lambda _: os.kill(victim, signal.SIGKILL),
    )
    assert killed.status == 200
    before = killed.events
    assert not any(e["event"] == "run.completed" for e in before), "the edge died mid-answer"
    run_id = before[0]["data"]["run_id"]

    rest = replay(edge0, chat["id"], run_id, last_event_id=before[-1]["id"])
    combined = before + rest
    ids = offsets(combined)
    assert ids == sorted(set(ids)), "no duplicate, in log order"
    assert combined[-1]["event"] == "run.completed"
    uninterrupted = replay(edge0, chat["id"], run_id)
    assert combined == uninterrupted, "no gap: exactly the run's whole stream"
    text = shown(combined).encode()

    def persisted():
        data = edge0.get(f"/v1/chats/{chat['id']}/messages").json()["data"]
        return data[1]["content"].encode() if len(data) == 2 else None

    assert wait_for(persisted) == text, "byte-identical to the stored answer"

    # the killed replica comes back and serves the same cursor again (edge restart)
    live.stack.start()
    live.stack.wait_ready()
    assert replay(live.client(token, 1), chat["id"], run_id, last_event_id=before[-1]["id"]) == rest
