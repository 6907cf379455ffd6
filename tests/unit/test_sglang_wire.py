"""The engine client against SGLang's wire, as SGLang's own server code produced it: each scenario's bytes were
recorded from its HTTP server, tokenizer manager and detokenizer at the pinned version, on a scripted scheduler
(tests/conformance, `make test-sglang`), with what that scheduler received. Replayed here byte for byte;
an upgrade of the pin is re-recorded there and checked here."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from conversation.tokens import load
from inference.engine import EngineBusy, EngineDown, EngineError, OpenAIStreamEngine, Request, generate

PIN = Path(__file__).resolve().parents[1] / "conformance/requirements-sglang.txt"
VERSION = next(line.split("==")[1] for line in PIN.read_text().splitlines() if line.startswith("sglang=="))
RECORDED = Path(__file__).parent / "data/sglang" / VERSION
MODEL = "smollm2-135m-instruct"
ASK = [{"role": "user", "content": "Tell me about the lighthouse."}]


def recorded(scenario: str) -> dict[str, Any]:
    return json.loads((RECORDED / f"{scenario}.json").read_text())


class Replay:
    """Answers as the recorded server did: each chat request with the next recorded answer, its bytes as they
    came; an answer the client closed before its end (a cancel) then goes silent, and one that had no headers
    yet (a request in SGLang's queue) never sends them. Keeps every request it gets."""

    def __init__(self, scenario: str) -> None:
        self.record = recorded(scenario)
        self.answers = [e for e in self.record["exchanges"] if e["path"] == "/v1/chat/completions"]
        self.chats: list[dict[str, Any]] = []
        self.aborts: list[dict[str, Any]] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/abort_request":
            self.aborts.append(json.loads(request.content))
            return httpx.Response(200)
        if request.url.path == "/health":
            return httpx.Response(200)
        self.chats.append(json.loads(request.content))
        answer = self.answers[min(len(self.chats), len(self.answers)) - 1]
        if answer["status"] == 0:
            await asyncio.sleep(3600)  # cancelled below: SGLang holds the headers until a first token

        async def body():
            yield answer["content"].encode()
            if not answer["ended"]:
                await asyncio.sleep(3600)

        return httpx.Response(answer["status"], content=body(), headers={"content-type": "text/event-stream"})


def engine(replay: Replay, **options: Any) -> OpenAIStreamEngine:
    client = OpenAIStreamEngine("sglang", "http://engine", **options)
    client._client = httpx.AsyncClient(transport=httpx.MockTransport(replay))
    return client


async def run(replay: Replay, request: Request, cancel_after: int | None = None, **kw: Any) -> tuple[list[str], Any]:
    cancel = asyncio.Event()
    texts: list[str] = []
    if (at := kw.pop("cancel_at_s", None)) is not None:
        asyncio.get_running_loop().call_later(at, cancel.set)
    heartbeat_s = kw.pop("heartbeat_s", None)
    async for text, outcome in generate(engine(replay, **kw), request, cancel, heartbeat_s):
        texts.append(text)
        if cancel_after is not None and len([t for t in texts if t]) == cancel_after:
            cancel.set()
    return texts, outcome


def scheduler(replay: Replay, kind: str) -> list[dict[str, Any]]:
    rid = replay.record["exchanges"][0]["body"]["rid"]
    return [e for e in replay.record["scheduler"] if e["kind"] == kind and e["rid"] == rid]


async def test_an_answer_streams_to_its_text_finish_and_usage_and_its_rid_and_priority_reached_the_scheduler():
    replay = Replay("stream")
    request = Request("run-stream", MODEL, ASK, 64, priority=50)
    texts, outcome = await run(replay, request)
    said = replay.record["outcome"]
    assert "".join(texts) == said["text"] and outcome.finish_reason == "stop"
    assert (outcome.prompt_tokens, outcome.completion_tokens) == (said["prompt_tokens"], said["completion_tokens"])
    [sent] = replay.chats
    assert sent["rid"] == request.rid and sent["priority"] == 50 and sent["stream_options"]["include_usage"]
    assert Request("run-stream", MODEL, ASK, 64).rid != request.rid  # each attempt is its own engine request
    [got] = scheduler(replay, "generate")  # what SGLang's tokenizer manager passed on from the recorded body
    assert got["rid"] == replay.record["exchanges"][0]["body"]["rid"] and got["priority"] == 50


def test_the_pool_s_tokenizer_counts_a_prompt_as_sglang_did():
    chat = load("gguf:")  # the tokenizer the recorded server's model folder was made from
    assert chat.count_chat(ASK) == recorded("stream")["outcome"]["prompt_tokens"]
    continued = recorded("continue")
    messages, continuation = continued["exchanges"][0]["body"]["messages"][:-1], " The lighthouse keeper"
    assert chat.count_continued(messages, continuation) == continued["outcome"]["prompt_tokens"]


async def test_the_next_turn_s_cached_prefix_is_read_from_its_usage():
    replay = Replay("cached")
    turn = replay.record["exchanges"][0]["body"]["messages"]
    _, outcome = await run(replay, Request("run-turn-2", MODEL, turn, 64, priority=0))
    assert 0 < outcome.cached_tokens == replay.record["outcome"]["cached_tokens"] < outcome.prompt_tokens


async def test_a_run_at_its_token_limit_ends_at_length():
    _, outcome = await run(Replay("length"), Request("run-length", MODEL, ASK, 5, priority=0))
    assert outcome.finish_reason == "length" and outcome.completion_tokens == 5


async def test_a_cancel_aborts_the_attempt_by_its_rid_and_sglang_stopped_decoding_it():
    replay = Replay("cancel")
    request = Request("run-cancel", MODEL, [{"role": "user", "content": "[[tokens=3000]] Go on."}], 4000)
    texts, outcome = await run(replay, request, cancel_after=3)
    assert outcome.finish_reason == "cancelled" and replay.aborts == [{"rid": request.rid}]
    [aborted] = [e for e in replay.record["exchanges"] if e["path"] == "/abort_request"]
    assert aborted["status"] == 200 and aborted["body"] == {"rid": replay.record["exchanges"][0]["body"]["rid"]}
    [done] = scheduler(replay, "finished")
    assert scheduler(replay, "abort") and done["reason"]["type"] == "abort" and done["tokens"] < 3000


async def test_a_run_in_sglang_s_queue_shows_progress_and_its_cancel_reaches_it_there():
    replay = Replay("queued_cancel")
    [answer] = replay.answers
    assert answer["status"] == 0 and answer["content"] == ""  # recorded: not a byte, not even headers
    request = Request("run-queued", MODEL, [{"role": "user", "content": "[[queue=60]] Hello."}], 32)
    texts, outcome = await run(replay, request, cancel_at_s=0.5, heartbeat_s=0.1)
    assert outcome.finish_reason == "cancelled" and texts and set(texts) == {""}
    assert replay.aborts == [{"rid": request.rid}]
    [done] = scheduler(replay, "finished")
    assert done["queued"] and done["tokens"] == 0  # SGLang took it out of its queue


async def test_a_full_queue_refused_in_the_stream_is_waited_out_with_the_same_request_then_fails_the_run():
    replay = Replay("queue_full")
    assert all(a["status"] == 200 and '"code": 503' in a["content"] for a in replay.answers)
    request = Request("run-full", MODEL, [{"role": "user", "content": "[[full]] Hello."}], 32, priority=0)
    with pytest.raises(EngineBusy, match="The request queue is full"):
        await run(replay, request, busy_wait_s=0.6)
    assert len(replay.chats) >= 2 and {c["rid"] for c in replay.chats} == {request.rid}
    assert replay.record["outcome"]["healthy_after"]


async def test_a_system_abort_after_tokens_fails_the_run_at_once_and_keeps_the_engine():
    replay = Replay("system_abort")
    request = Request("run-retract", MODEL, [{"role": "user", "content": "[[retract]] Hello."}], 64, priority=0)
    with pytest.raises(EngineBusy, match="Retracted"):
        await run(replay, request)
    assert len(replay.chats) == 1 and replay.record["outcome"]["healthy_after"]


async def test_a_prompt_over_the_context_is_the_run_s_refusal_not_the_engine_s_failure():
    replay = Replay("too_long")
    assert replay.answers[0]["status"] == 400
    with pytest.raises(EngineError, match="400") as refused:
        await run(replay, Request("run-long", MODEL, [{"role": "user", "content": "lighthouse " * 9000}], 64))
    assert not isinstance(refused.value, EngineBusy) and len(replay.chats) == 1


async def test_an_abort_nobody_here_asked_for_hands_the_run_off():
    replay = Replay("graceful_abort")
    request = Request("run-outside", MODEL, [{"role": "user", "content": "[[tokens=3000]] Go on."}], 4000)
    with pytest.raises(EngineDown, match="aborted"):
        await run(replay, request)
    [done] = scheduler(replay, "finished")
    assert done["reason"]["type"] == "abort"  # the client's abort call alone ended it, its stream still open


def test_sglang_s_health_is_a_one_token_generation():
    record = recorded("health")
    [health] = [e for e in record["exchanges"] if e["path"] == "/health"]
    assert health["status"] == 200 and record["outcome"]["healthy"]
    assert any(e["kind"] == "generate" and e["health"] and e["max_new_tokens"] == 1 for e in record["scheduler"])
