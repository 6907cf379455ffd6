"""The one chat client (replay/client.py) over a canned SSE body: how it folds a stream into a Run, when `then`
fires, and what a refusal gives back. The client against the real edge: every test under tests/stack/."""

import asyncio
import json

import httpx

from replay.client import AsyncChatClient, ChatClient


def body(*events):
    return "".join(f"id: {i}\nevent: {name}\ndata: {json.dumps(data)}\n\n" for i, (name, data) in enumerate(events))


STREAM = body(
    ("run.started", {"run_id": "r1", "chat_id": "c", "model": "m"}),
    ("token", {"run_id": "r1", "delta": "Hello"}),
    ("token", {"run_id": "r1", "delta": " there, friend"}),
    ("moderation", {"run_id": "r1", "action": "retract", "retract_from": 11}),
    ("run.completed", {"run_id": "r1", "finish_reason": "content_filter", "usage": {"completion_tokens": 3}}),
)


def answer(request: httpx.Request) -> httpx.Response:
    if request.url.path.endswith("/messages") and json.loads(request.content)["content"] == "too much":
        return httpx.Response(429, headers={"Retry-After": "3"}, json={"error": {"code": "over_capacity"}})
    seen.append((request.method, request.url.path, request.headers.get("Last-Event-ID")))
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, text=STREAM)


seen: list = []


def client() -> ChatClient:
    return ChatClient(httpx.Client(transport=httpx.MockTransport(answer), base_url="http://edge"))


def test_a_stream_is_folded_into_a_run_with_the_answer_as_shown():
    run = client().send("c", "hi", max_tokens=8)
    assert (run.status, run.run_id, run.tokens, run.last_id) == (200, "r1", 2, "4")
    assert run.text == "Hello there"  # cut at the retraction
    assert run.completed["finish_reason"] == "content_filter"
    assert run.ttft_s is not None and len(run.token_times) == 2 and not run.dropped


def test_then_fires_once_when_its_condition_first_holds_and_true_drops_the_connection():
    calls = []
    run = client().send("c", "hi", when=lambda r: r.tokens >= 1, then=lambda r: calls.append(len(r.events)))
    assert calls == [2] and len(run.events) == 5
    dropped = client().send("c", "hi", when=lambda r: r.tokens >= 2, then=lambda r: True)
    assert dropped.dropped and dropped.names == ["run.started", "token", "token"]


def test_a_refusal_is_a_run_with_its_error_and_headers():
    run = client().send("c", "too much")
    assert run.status == 429 and run.headers["retry-after"] == "3"
    assert run.error == {"error": {"code": "over_capacity"}} and run.events == []


def test_resume_sends_the_cursor_and_the_async_client_reads_the_same():
    seen.clear()
    client().resume("c", "r1", "2")
    assert seen == [("GET", "/v1/chats/c/runs/r1/events", "2")]

    async def read():
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="http://edge") as http:
            return await AsyncChatClient(http).send("c", "hi")

    assert asyncio.run(read()).text == "Hello there"


def test_an_openai_stream_is_read_as_its_chunks_content():
    chunks = "".join(
        f"data: {json.dumps({'choices': [{'delta': {'content': piece}}]})}\n\n" for piece in ("Bon", "", "jour")
    )

    def engine(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["stream"] is True and request.url.path == "/v1/chat/completions"
        return httpx.Response(200, text=chunks + "data: [DONE]\n\n")

    http = httpx.Client(transport=httpx.MockTransport(engine))
    run = ChatClient(http, base="http://engine:8080").complete([{"role": "user", "content": "hi"}], max_tokens=4)
    assert (run.text, run.tokens, run.code) == ("Bonjour", 2, None) and run.events[-1]["data"] == "[DONE]"
