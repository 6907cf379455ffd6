"""One chat, one run at a time: a message sent while the chat's answer is still running is refused 409 chat_busy
at once (never a wait in the scheduler ending in over_capacity); of messages sent at once into an idle chat,
exactly one is answered; the next message right after an answer's `done` is taken."""

import concurrent.futures
import time

from replay.client import ChatClient

from .conftest import wait_for

LONG = "Write a very long, detailed story about a lighthouse keeper and the sea."


def test_a_busy_chat_answers_409_at_once_and_takes_the_next_message_after_done(live):
    client = live.client(live.token())
    chats = ChatClient(client)
    chat = chats.new_chat()
    refused = []

    def second_message(run):
        started = time.perf_counter()
        answer = client.post(f"/v1/chats/{chat}/messages", json={"content": "And then?", "max_tokens": 4})
        refused.append((answer, time.perf_counter() - started))
        chats.cancel(chat, run.run_id)  # and read the first run to its end

    first = chats.send(chat, LONG, max_tokens=400, when=lambda r: r.tokens >= 2, then=second_message)
    assert first.status == 200 and first.events[-1]["event"] == "run.completed"
    ((answer, took_s),) = refused
    assert answer.status_code == 409, answer.text
    error = answer.json()["error"]
    assert error["code"] == "chat_busy" and error["type"] == "conflict_error"
    assert answer.headers["x-run-id"] == first.run_id and answer.headers["retry-after"] == "1"
    print(f"busy chat answered 409 in {took_s * 1000:.0f} ms")

    # sent the moment the first stream ended: the edge recorded the run's end before its last event
    after = chats.send(chat, "Thanks.", max_tokens=4)
    assert after.status == 200 and after.events[-1]["event"] == "run.completed", after.events[-1:]
    messages = wait_for(lambda: (m := client.get(f"/v1/chats/{chat}/messages").json()["data"]) and len(m) == 4 and m)
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"], "nothing of the 409 stored"
    assert "And then?" not in [m["content"] for m in messages]


def test_of_messages_sent_at_once_into_one_chat_exactly_one_runs(live):
    client = live.client(live.token())
    chat = ChatClient(client).new_chat()

    def send(i: int):
        return ChatClient(client).send(chat, f"Say the number {i}.", max_tokens=4, when=lambda r: False)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        runs = list(pool.map(send, range(6)))
    statuses = sorted(r.status for r in runs)
    assert statuses == [200] + [409] * 5, statuses
    taken = next(r for r in runs if r.status == 200)
    assert taken.events[-1]["event"] == "run.completed"
    stored = wait_for(lambda: (m := client.get(f"/v1/chats/{chat}/messages").json()["data"]) and len(m) >= 2 and m)
    assert len(stored) == 2 and stored[1]["id"] == taken.run_id
