"""The engine client (inference/engine.py) against SGLang's own server code: what the inference consumer sends
and how it reads what comes back. Each scenario's exchanges are recorded for the unit tests (conftest.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from conversation.tokens import load
from inference.engine import EngineDown, EngineError, OpenAIStreamEngine, Request, generate

from .conftest import MODEL, REPLY, Recording, Server

ASK = [{"role": "user", "content": "Tell me about the lighthouse."}]


def client(server: Server, **options: Any) -> tuple[OpenAIStreamEngine, Recording]:
    engine = OpenAIStreamEngine("sglang", server.url, **options)
    recording = Recording()
    engine._client = httpx.AsyncClient(transport=recording, timeout=httpx.Timeout(300, connect=5))
    return engine, recording


async def drive(
    server: Server,
    request: Request,
    scenario: str,
    *,
    cancel_after: int | None = None,
    cancel_at_s: float | None = None,
    heartbeat_s: float | None = None,
    outside_abort_after: int | None = None,
    **options: Any,
) -> dict[str, Any]:
    """One run through `generate`, as the consumer makes it; its outcome, recorded with its exchanges."""
    engine, recording = client(server, **options)
    since = time.time()
    cancel = asyncio.Event()
    texts: list[str] = []
    result: dict[str, Any] = {"error": None}
    if cancel_at_s is not None:
        asyncio.get_running_loop().call_later(cancel_at_s, cancel.set)
    try:
        async for text, outcome in generate(engine, request, cancel, heartbeat_s):
            texts.append(text)
            shown = [t for t in texts if t]
            if cancel_after is not None and len(shown) == cancel_after:
                result["cancelled_wall"] = time.time()
                cancel.set()
            if outside_abort_after is not None and len(shown) == outside_abort_after:
                await engine.abort(request)  # the client's own call, its stream left open
        result.update(
            finish_reason=outcome.finish_reason,
            prompt_tokens=outcome.prompt_tokens,
            completion_tokens=outcome.completion_tokens,
            cached_tokens=outcome.cached_tokens,
        )
    except (EngineError, EngineDown) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    # empty deltas: the consumer's heartbeats, and SGLang's chunks with no text (its role and usage chunks)
    result.update(text="".join(texts), pieces=[t for t in texts if t], empty_deltas=texts.count(""))
    result["healthy_after"] = await engine.healthy()
    await engine.aclose()
    await asyncio.sleep(0.3)  # the scheduler's last records
    scheduler = server.scheduler(since)
    server.save(scenario, recording, scheduler, result)
    result["exchanges"], result["scheduler"] = recording.exchanges, scheduler
    return result


def ours(result: dict[str, Any], rid: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in result["scheduler"] if e["kind"] == kind and e["rid"] == rid]


def chats(result: dict[str, Any]) -> list:
    return [e for e in result["exchanges"] if e.path == "/v1/chat/completions"]


async def test_an_answer_streams_with_its_rid_priority_usage_and_the_pool_s_own_token_count(sglang):
    request = Request("run-stream", MODEL, ASK, 64, priority=50)
    result = await drive(sglang, request, "stream")
    assert result["error"] is None and result["text"] == REPLY and result["finish_reason"] == "stop"
    [got] = ours(result, request.rid, "generate")
    assert got["priority"] == 50 and got["max_new_tokens"] == 64
    assert result["prompt_tokens"] == got["prompt_tokens"] == load(f"hf:{sglang.model_dir}").count_chat(ASK)
    [done] = ours(result, request.rid, "finished")
    assert result["completion_tokens"] == done["tokens"]


async def test_the_next_turn_reports_the_prefix_the_engine_had_cached_in_its_usage(sglang):
    first = await drive(sglang, Request("run-turn-1", MODEL, ASK, 64, priority=0), "turn_1")
    turn = [*ASK, {"role": "assistant", "content": first["text"]}, {"role": "user", "content": "And the storm?"}]
    request = Request("run-turn-2", MODEL, turn, 64, priority=0)
    result = await drive(sglang, request, "cached")
    [got] = ours(result, request.rid, "generate")
    assert 0 < result["cached_tokens"] < result["prompt_tokens"] == got["prompt_tokens"]


async def test_a_run_at_its_token_limit_ends_at_length(sglang):
    request = Request("run-length", MODEL, ASK, 5, priority=0)
    result = await drive(sglang, request, "length")
    assert result["finish_reason"] == "length" and result["completion_tokens"] == 5


async def test_a_continued_answer_is_counted_as_the_pool_counts_it(sglang):
    request = Request("run-continue", MODEL, ASK, 64, continuation=" The lighthouse keeper", priority=0)
    result = await drive(sglang, request, "continue")
    [got] = ours(result, request.rid, "generate")
    chat = load(f"hf:{sglang.model_dir}")
    assert got["prompt_tokens"] == result["prompt_tokens"] == chat.count_continued(ASK, request.continuation)
    assert result["error"] is None and result["finish_reason"] == "stop"


async def test_a_cancel_aborts_the_attempt_in_the_engine_by_its_rid(sglang):
    request = Request("run-cancel", MODEL, [{"role": "user", "content": "[[tokens=3000]] Go on."}], 4000)
    result = await drive(sglang, request, "cancel", cancel_after=3)
    assert result["finish_reason"] == "cancelled" and len(result["pieces"]) == 3
    [abort] = [e for e in result["exchanges"] if e.path == "/abort_request"]
    assert abort.body == {"rid": request.rid} and abort.status == 200
    assert ours(result, request.rid, "abort")
    [done] = ours(result, request.rid, "finished")
    assert done["reason"]["type"] == "abort" and done["tokens"] < 3000  # it stopped decoding
    assert result["healthy_after"]


async def test_a_run_waiting_in_the_engine_s_queue_shows_progress_and_its_cancel_reaches_the_queue(sglang):
    request = Request("run-queued", MODEL, [{"role": "user", "content": "[[queue=60]] Hello."}], 32)
    result = await drive(sglang, request, "queued_cancel", cancel_at_s=2.0, heartbeat_s=0.25)
    assert result["finish_reason"] == "cancelled" and result["pieces"] == []
    assert result["empty_deltas"] >= 4  # SGLang sent nothing meanwhile; the consumer showed progress anyway
    [stream] = chats(result)
    assert stream.first_byte_s is None or stream.content.strip() == b"", stream.content[:300]
    [done] = ours(result, request.rid, "finished")
    assert done.get("queued") and done["tokens"] == 0
    assert [e.body for e in result["exchanges"] if e.path == "/abort_request"] == [{"rid": request.rid}]


async def test_a_full_queue_is_waited_out_then_fails_the_run_and_not_the_engine(sglang):
    request = Request("run-full", MODEL, [{"role": "user", "content": "[[full]] Hello."}], 32, priority=0)
    result = await drive(sglang, request, "queue_full", busy_wait_s=1.5)
    assert result["error"].startswith("EngineBusy") and "The request queue is full." in result["error"]
    attempts = chats(result)  # SGLang answers 200 and refuses in the stream, with the code 503
    assert len(attempts) >= 2 and all(a.status == 200 and '"code": 503' in a.content.decode() for a in attempts)
    assert {a.body["rid"] for a in attempts} == {request.rid}  # refused, never started: the same request again
    assert result["healthy_after"]


async def test_a_system_abort_mid_stream_fails_the_run_and_not_the_engine(sglang):
    request = Request("run-retract", MODEL, [{"role": "user", "content": "[[retract]] Hello."}], 64, priority=0)
    result = await drive(sglang, request, "system_abort")
    assert result["error"].startswith("EngineBusy") and "Retracted" in result["error"]
    assert len(result["pieces"]) >= 1 and result["healthy_after"]


async def test_a_prompt_over_the_context_is_refused_and_the_engine_stays(sglang):
    long = [{"role": "user", "content": "lighthouse " * 9000}]
    result = await drive(sglang, Request("run-long", MODEL, long, 64, priority=0), "too_long")
    assert result["error"].startswith("EngineError") and "400" in result["error"]
    assert result["healthy_after"]


async def test_the_abort_call_alone_stops_the_decode_and_an_abort_nobody_asked_for_hands_the_run_off(sglang):
    """The client's abort call with its stream left open: SGLang ends the sequence (finish_reason "abort") by
    that call alone, not by a closed connection. Seen by a consumer that did not ask for it (an operator's abort,
    a server shutting down), the run is handed to another engine."""
    request = Request("run-outside", MODEL, [{"role": "user", "content": "[[tokens=3000]] Go on."}], 4000)
    result = await drive(sglang, request, "graceful_abort", outside_abort_after=3)
    assert result["error"].startswith("EngineDown")
    [stream] = chats(result)
    assert '"finish_reason":"abort"' in stream.content.decode()
    [done] = ours(result, request.rid, "finished")
    assert done["reason"]["type"] == "abort" and done["tokens"] < 3000


async def test_health_is_a_one_token_generation_and_the_metrics_page_is_sglang_s(sglang):
    engine, recording = client(sglang)
    since = time.time()
    started = time.monotonic()
    assert await engine.healthy()
    elapsed = time.monotonic() - started
    health = [e for e in sglang.scheduler(since) if e["kind"] == "generate" and e["health"]]
    assert health and health[0]["max_new_tokens"] == 1
    sglang.save("health", recording, sglang.scheduler(since), {"healthy": True, "elapsed_s": round(elapsed, 2)})
    page = await engine.metrics()  # the HTTP side's series (the scheduler's are not served by a scripted one)
    assert page is not None and b"sglang:time_to_first_token_seconds" in page
    await engine.aclose()
