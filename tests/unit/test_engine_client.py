"""The engine client's side of SGLang's protocol (as its server code behaves at v0.5.23): each attempt named by
its rid, the run's priority sent, a cancel aborting the request in the engine, a full engine's 503 waited out,
any other refusal failing the run without evicting the engine. The engine here is httpx's MockTransport
answering as SGLang's code does; SGLang's own server imports torch, not installed here (docs/gpu.md)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from inference.engine import EngineDown, EngineError, OpenAIStreamEngine, Request, generate

CHUNK = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def sse(delta: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": delta}, "finish_reason": finish}
    return f"data: {json.dumps({**CHUNK, 'choices': [choice]})}\n\n".encode()


class Engine:
    """Answers /v1/chat/completions from a script of statuses, streams a token and then waits; records every
    request, and every abort."""

    def __init__(self, statuses: list[int], hang: bool = True) -> None:
        self.statuses, self.hang = statuses, hang
        self.bodies: list[dict] = []
        self.aborted: list[dict] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/abort_request":
            self.aborted.append(body)
            return httpx.Response(200)
        self.bodies.append(body)
        status = self.statuses.pop(0) if self.statuses else 200
        if status != 200:
            return httpx.Response(status, json={"object": "error", "message": "no", "code": status})

        async def stream():
            yield sse("Hello")
            if self.hang:
                await asyncio.sleep(3600)  # a long answer, until it is stopped
            yield sse("", "stop")
            yield b"data: [DONE]\n\n"

        return httpx.Response(200, content=stream(), headers={"content-type": "text/event-stream"})


def engine(name: str, fake: Engine, **options) -> OpenAIStreamEngine:
    client = OpenAIStreamEngine(name, "http://engine", **options)
    client._client = httpx.AsyncClient(transport=httpx.MockTransport(fake))
    return client


def ask(priority: int | None = 50) -> Request:
    return Request("run-1", "m", [{"role": "user", "content": "Hi"}], 16, priority=priority)


async def test_a_cancel_aborts_the_attempt_by_its_rid_and_the_run_carries_its_priority():
    fake = Engine([])
    sglang, request, cancel = engine("sglang", fake), ask(), asyncio.Event()
    texts = []
    async for text, outcome in generate(sglang, request, cancel):
        texts.append(text)
        cancel.set()  # the user stops it after the first token
    assert texts[0] == "Hello" and outcome.finish_reason == "cancelled"
    assert fake.aborted == [{"rid": request.rid}]
    [body] = fake.bodies
    assert body["rid"] == request.rid and body["rid"].startswith("run-1-") and body["priority"] == 50
    assert ask().rid != request.rid  # another attempt at the run is another engine request


async def test_llama_server_gets_neither_rid_nor_priority_and_no_abort_call():
    fake = Engine([])
    llama, cancel = engine("llamacpp-remote", fake), asyncio.Event()
    async for _ in generate(llama, ask(), cancel):
        cancel.set()
    assert "rid" not in fake.bodies[0] and "priority" not in fake.bodies[0]
    assert fake.aborted == []  # its slot is freed when the stream closes


async def test_a_full_engine_is_waited_for_and_the_attempt_sent_again():
    fake = Engine([503, 503], hang=False)
    texts = [text async for text, _ in generate(engine("sglang", fake, busy_wait_s=10), ask())]
    assert "".join(texts) == "Hello" and len(fake.bodies) == 3
    assert len({b["rid"] for b in fake.bodies}) == 1  # refused, so never started: the same request again


async def test_a_refusal_fails_the_run_and_only_an_unreachable_engine_is_down():
    with pytest.raises(EngineError, match="500"):  # one request's failure: the engine stays in its pool
        async for _ in generate(engine("sglang", Engine([500])), ask()):
            pass
    with pytest.raises(EngineError, match="503"):  # full for longer than the wait
        async for _ in generate(engine("sglang", Engine([503] * 50), busy_wait_s=0.6), ask()):
            pass

    def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    down = OpenAIStreamEngine("sglang", "http://engine")
    down._client = httpx.AsyncClient(transport=httpx.MockTransport(unreachable))
    with pytest.raises(EngineDown):
        async for _ in generate(down, ask()):
            pass


async def test_a_health_check_on_a_connection_the_server_closed_is_asked_again_not_failed():
    answers = iter([httpx.RemoteProtocolError("Server disconnected without sending a response."), None])

    def health(request: httpx.Request) -> httpx.Response:
        broken = next(answers)
        if broken is not None:
            raise broken
        return httpx.Response(200)

    engine = OpenAIStreamEngine("sglang", "http://engine")
    engine._client = httpx.AsyncClient(transport=httpx.MockTransport(health))
    assert await engine.healthy() and engine.unhealthy_reason == ""

    def refused(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503)

    engine._client = httpx.AsyncClient(transport=httpx.MockTransport(refused))
    assert not await engine.healthy() and engine.unhealthy_reason == "HTTP 503"


async def test_the_engine_s_metrics_page_is_passed_through_and_its_absence_is_none():
    """The engine listens on its pod's loopback: the consumer serves its page on /engine/metrics."""
    page = b'# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{model_name="m"} 3.0\n'

    def metrics(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=page) if request.url.path == "/metrics" else httpx.Response(404)

    engine = OpenAIStreamEngine("sglang", "http://engine")
    engine._client = httpx.AsyncClient(transport=httpx.MockTransport(metrics))
    assert await engine.metrics() == page
    engine._client = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(404)))
    assert await engine.metrics() is None

    def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    engine._client = httpx.AsyncClient(transport=httpx.MockTransport(unreachable))
    assert await engine.metrics() is None


class Queued(Engine):
    """SGLang with a queue: nothing, not even the response headers, until the request is scheduled."""

    def __init__(self, queued_s: float) -> None:
        super().__init__([], hang=False)
        self.queued_s = queued_s

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/abort_request":
            await asyncio.sleep(self.queued_s)
        return await super().__call__(request)


async def test_a_request_waiting_in_the_engine_s_queue_shows_progress_and_can_be_cancelled_there():
    """The consumer's own timer stands for the engine's silence: an empty delta each heartbeat, which the run
    publishes as a keepalive (the edge cuts a run after 60 s without progress); a cancel while it waits
    aborts it in the engine by its rid."""
    sglang, request = engine("sglang", Queued(0.35)), ask()
    seen = [text async for text, _ in generate(sglang, request, heartbeat_s=0.1)]
    first = next(i for i, text in enumerate(seen) if text)
    assert first >= 2 and seen[:first] == [""] * first and "Hello" in seen

    fake = Queued(5.0)
    sglang, request, cancel = engine("sglang", fake), ask(), asyncio.Event()
    async for text, outcome in generate(sglang, request, cancel, heartbeat_s=0.05):
        assert text == ""
        cancel.set()  # the user stops it while it is still queued
    assert outcome.finish_reason == "cancelled" and fake.aborted == [{"rid": request.rid}]
