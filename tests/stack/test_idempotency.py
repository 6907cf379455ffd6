"""Idempotency-Key on the three routes that make something: a retry with the same key, sent while the first is
still answering or after it ended, gets the first one's chat or run (its stream from the start), never a second;
the same key with another body is a 422."""

import concurrent.futures

from replay.client import ChatClient
from replay.sse import iter_sse

from .conftest import wait_for

LONG = "Write a long story about a lighthouse keeper."


def test_a_retried_message_gets_the_first_run_never_a_second(live):
    client = live.client(live.token())
    chats = ChatClient(client)
    chat = client.post("/v1/chats", headers={"Idempotency-Key": "chat-1"}).json()
    assert client.post("/v1/chats", headers={"Idempotency-Key": "chat-1"}).json()["id"] == chat["id"]
    url = f"/v1/chats/{chat['id']}/messages"
    body = {"content": LONG, "max_tokens": 40}
    keyed = ChatClient(client, headers={"Idempotency-Key": "msg-1"})

    # the connection drops after the first token; the retry, made while the run still answers, reads it whole
    first = keyed.send(chat["id"], LONG, max_tokens=40, when=lambda r: r.tokens >= 1, then=lambda r: True)
    assert first.status == 200 and first.dropped
    retried = keyed.send(chat["id"], LONG, max_tokens=40)
    assert retried.status == 200 and retried.run_id == first.run_id, (retried.status, retried.error)
    assert retried.names[0] == "run.queued" and retried.names[-1] == "run.completed"
    # and after it ended: the same run again, whole
    again = keyed.send(chat["id"], LONG, max_tokens=40)
    assert again.run_id == first.run_id and again.text == retried.text

    other = client.post(url, json={**body, "content": "Something else"}, headers={"Idempotency-Key": "msg-1"})
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"

    # two at once with one key: one run, both streams of it
    def send(_):
        return ChatClient(client, headers={"Idempotency-Key": "msg-2"}).send(chat["id"], "Name a fruit.", max_tokens=6)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        pair = list(pool.map(send, range(2)))
    assert [r.status for r in pair] == [200, 200] and pair[0].run_id == pair[1].run_id
    stored = wait_for(lambda: (m := client.get(url).json()["data"]) and len(m) == 4 and m)
    assert [m["role"] for m in stored] == ["user", "assistant"] * 2, "one run per key, nothing more stored"
    assert {stored[1]["id"], stored[3]["id"]} == {first.run_id, pair[0].run_id}
    assert chats.send(chat["id"], "Thanks.", max_tokens=2).status == 200, "no key: a new run as ever"


def test_a_retried_completion_is_the_first_run(live):
    client = live.client(live.token())
    body = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8}
    keyed = {"Idempotency-Key": "completion-1"}
    first = client.post("/v1/chat/completions", json=body, headers=keyed)
    again = client.post("/v1/chat/completions", json=body, headers=keyed)
    assert first.status_code == again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]
    assert again.json()["usage"] == first.json()["usage"]

    # streamed: a client that goes away does not cancel a keyed run; its retry reads all of it
    stream_body = {**body, "stream": True, "max_tokens": 24}
    keyed = {"Idempotency-Key": "completion-2"}
    with client.stream("POST", "/v1/chat/completions", json=stream_body, headers=keyed) as response:
        assert response.status_code == 200
        opening = next(iter_sse(response.iter_lines()))
    with client.stream("POST", "/v1/chat/completions", json=stream_body, headers=keyed) as response:
        events = list(iter_sse(response.iter_lines()))
    ids = {e["data"]["id"] for e in events if isinstance(e["data"], dict)}
    assert ids == {opening["data"]["id"]}
    ends = [e["data"]["choices"][0]["finish_reason"] for e in events if isinstance(e["data"], dict)]
    assert ends[-1] in ("stop", "length"), "the whole run, not a cancelled one"
    assert events[-1]["data"] == "[DONE]"


def test_a_refused_request_releases_its_key(live):
    client = live.client(live.token())
    chats = ChatClient(client)
    chat = chats.new_chat()
    keyed = ChatClient(client, headers={"Idempotency-Key": "busy-1"})
    refused = []

    def retry_while_busy(run):
        refused.append(keyed.send(chat, "Hello?", max_tokens=2))
        chats.cancel(chat, run.run_id)

    chats.send(chat, LONG, max_tokens=200, when=lambda r: r.tokens >= 1, then=retry_while_busy)
    assert refused[0].status == 409 and refused[0].code == "chat_busy"
    taken = keyed.send(chat, "Hello?", max_tokens=2)
    assert taken.status == 200 and taken.names[-1] == "run.completed", "the 409 released the key: a new run"
