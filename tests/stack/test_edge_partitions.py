"""Edge replicas claim their reply partitions by group membership: no hand-set partition, every partition
held by exactly one live replica, a dead replica's partitions taken over, and a stream whose partition moves
mid-answer continues from the log with no gap and no duplicate."""

import os
import signal
import threading

import httpx

from replay.client import ChatClient

from ..sse import shown
from .conftest import PORT_BASE, wait_for


def owned(replica: int) -> list[int] | None:
    try:
        response = httpx.get(f"http://127.0.0.1:{PORT_BASE + 100 * replica}/readyz", timeout=5)
    except httpx.HTTPError:
        return None
    return response.json()["reply_partitions"] if response.status_code == 200 else None


def test_replicas_split_the_reply_partitions_and_one_takes_over_a_dead_ones(live):
    total = set(range(live.stack.settings.reply_partitions))
    first, second = owned(0), owned(1)
    assert first and second and not set(first) & set(second) and set(first) | set(second) == total

    token = live.token()
    edge0 = live.client(token, 0)
    chat = edge0.post("/v1/chats").json()
    os.killpg(live.stack.pids()["api-1"], signal.SIGKILL)
    try:
        # the dead replica's 30 s session runs out, then the group rebalances
        taken = wait_for(lambda: set(owned(0) or ()) == total, 90, 0.5)
        assert taken, f"edge 0 holds {owned(0)} after edge 1 died"
        # A long answer streams on edge 0 while edge 1 comes back and the group moves partitions under it.
        restarted = threading.Thread(target=lambda: (live.stack.start(), live.stack.wait_ready()))
        story = "Write a long story about a lighthouse keeper and a storm."
        # at the third token edge 1 joins the group: a rebalance while this stream runs, read on to its end
        run = ChatClient(edge0).send(
            chat["id"], story, max_tokens=400, when=lambda r: r.tokens >= 3, then=lambda _: restarted.start()
        )
        assert run.status == 200
        events = run.events
        restarted.join(120)
    finally:
        if "api-1" not in live.stack.pids():
            live.stack.start()
            live.stack.wait_ready()
    ids = [int(e["id"].split(":")[2]) for e in events]
    assert ids == sorted(set(ids)), "no duplicate, in log order"
    assert events[-1]["event"] == "run.completed"
    text = shown(events)

    def answer():
        return [m for m in edge0.get(f"/v1/chats/{chat['id']}/messages").json()["data"] if m["role"] == "assistant"]

    stored = wait_for(answer, 30)
    assert stored and stored[0]["content"] == text, "no gap: the stream is the stored answer"
    first, second = owned(0), owned(1)
    assert first and second and not set(first) & set(second) and set(first) | set(second) == total

    # the replica that came back serves new runs on its own partitions
    edge1 = live.client(token, 1)
    again = ChatClient(edge1).send(chat["id"], "Say hi.", max_tokens=8).events
    assert again[-1]["event"] == "run.completed" and int(again[-1]["id"].split(":")[1]) in second
