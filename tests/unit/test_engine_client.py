"""The engine client beside SGLang's own wire (tests/unit/test_sglang_wire.py replays that): llama-server gets no
rid, priority or abort call; an HTTP 503 (llama-server loading its model, a gateway in front of an engine) is
waited out and any other refusal fails the run without evicting the engine; a health check on a connection the
server closed is asked again; the engine's metrics page passes through. The engine is httpx's MockTransport."""

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
