"""OpenAI-compatible `POST /v1/chat/completions`, stream and non-stream, through the same pipeline.

The run goes through moderation, scheduling, inference and metering like any chat turn, carrying the whole
conversation the client sent; it is not stored as a chat (the API is stateless) but stays in the event log.
The edge waits for the run's first record before answering, so a refusal or a failure to start is a proper
HTTP error, not a broken stream. There is no resume on this route, so a client that disconnects before the
end cancels the run (nobody could read the rest of it), unless it sent an Idempotency-Key: then its retry reads
the whole run from the log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sse_starlette.sse import EventSourceResponse

from api import idempotency, runs, streams
from api.auth import CurrentUser, Principal
from api.deps import Deps, Services
from api.errors import ApiError
from api.idempotency import IdempotencyKey
from api.openai_request import Completion, conversation, generation
from api.openai_schemas import (
    AssistantMessage,
    CachedTokens,
    ChatCompletion,
    Choice,
    CompletionUsage,
)
from api.openapi import CHUNKS, ENGINE_ERRORS
from api.preferences import allowed_model
from api.redaction import HEADER, redacted_messages
from api.replies import ACCEPTED, REJECTED, TERMINAL, Reply
from api.runs import checked_max_tokens
from storage.idempotency import Claim
from storage.ids import new_id
from topics import records
from topics.events import ChatMessage, Generation, PromptAccepted, TokenDelta

log = logging.getLogger(__name__)
router = APIRouter()

FINISH = {"stop": "stop", "length": "length", "cancelled": "stop"}


def tools_message(decoding: Generation | None) -> list[ChatMessage]:
    """The tools' definitions as the prompt carries them, for the request's size at the door."""
    tools = decoding.get("tools") if decoding else None
    return [{"role": "system", "content": tools}] if tools else []


def conversation_key(user_id: str, messages: list[ChatMessage]) -> str:
    """A stateless client resends its conversation each turn; the same opening (system prompt and first user
    message) gives the same key, so each turn is routed like a chat's: to the engine holding its prefix warm."""
    first_user = next(i for i, m in enumerate(messages) if m["role"] == "user")
    opening = [(m["role"], m["content"]) for m in messages[: first_user + 1]]
    return str(uuid.uuid5(uuid.NAMESPACE_URL, json.dumps([user_id, opening])))


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletion,
    responses={**CHUNKS, **ENGINE_ERRORS},
)
async def chat_completions(
    deps: Deps, user: CurrentUser, body: Completion, key: IdempotencyKey = None
) -> JSONResponse | EventSourceResponse:
    """With an Idempotency-Key, a retry gets the first request's run (whole, read from the log), and a client
    that goes away does not cancel the run: its retry reads it."""
    messages, taken = redacted_messages(deps, user, conversation(deps.settings, body))
    decoding = generation(body)
    max_tokens = checked_max_tokens(deps.settings, body.max_completion_tokens or body.max_tokens)
    model = allowed_model(deps.settings, deps.limits, user, body.model)
    chat_id, run_id = conversation_key(user.user_id, messages), str(new_id())
    partition = runs.reply_partition(deps)
    if key is not None:
        wanted = Claim(idempotency.digest("chat_completions", body), None, run_id, partition)
        held = await idempotency.claim(deps.idempotency, user, idempotency.checked(key), wanted)
        if held is not None and held.run_id and held.reply_partition is not None:
            run = held.run_id
            reply, replies = await idempotency.first_replies(
                deps, run, held.reply_partition, stream_refusals=False
            )
            return await respond(deps, body, run, model, reply, replies, None)
    event = records.prompt_accepted(
        run_id=run_id,
        chat_id=chat_id,
        user_id=user.user_id,
        tier=user.tier,
        message_id=str(new_id()),
        content=messages[-1]["content"],
        max_tokens=max_tokens,
        model=model,
        reply_partition=partition,
        prev_run_id=None,
        messages=messages,
        temperature=body.temperature,
        store=False,
        generation=decoding,
    )
    abandon = None if key else partial(cancel, deps, user, event, "client_disconnected")
    holder = idempotency.Holder(deps.idempotency, user, key)
    try:
        sized = messages + tools_message(decoding)
        runs.shed_when_full(deps, user, run_id, model, sized, max_tokens, may_grow=False)
        try:
            live = await runs.start_run(deps, event)
        except Exception:
            deps.pools.decided(run_id)  # never reached the log: the door stops counting it
            raise
        await holder.made()
        replies = aiter(streams.live(deps, run_id, partition, live))
        reply, replies = await runs.admitted(deps, event, replies, stream_refusals=False)
    except BaseException as exc:
        await holder.failed(exc)
        raise
    response = await respond(deps, body, run_id, model, reply, replies, abandon)
    if taken:
        response.headers[HEADER] = ",".join(taken)
    return response


async def respond(
    deps: Services,
    body: Completion,
    run_id: str,
    model: str | None,
    reply: Reply,
    replies: AsyncIterator[Reply],
    abandon: Callable[[], Awaitable[None]] | None,
) -> JSONResponse | EventSourceResponse:
    """The run's answer as chunks or one completion, from its first reply; `abandon`: what to do when it is
    left before its end (the client went away or it stalled)."""
    handed_over = ended = False
    try:
        ended = reply.kind in TERMINAL
        check_end(reply)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            handed_over = True  # the generator owns the run from here
            chunks = chunk_stream(deps, run_id, model, reply, replies, include_usage, abandon)
            return EventSourceResponse(chunks, ping=15)
        text: list[str] = []
        tool_calls: list[dict[str, Any]] = []
        while reply.kind not in TERMINAL:  # a slow decision (`accepted`) only means a longer wait
            if reply.kind == "delta":
                text.append(reply.delta["text"])
                tool_calls += json.loads(reply.delta.get("tool_calls") or "[]")
            elif (
                reply.kind == "moderation"
            ):  # the answer was cut: what follows retract_from is withdrawn
                text = ["".join(text)[: reply.delta["retract_from"] or 0]]
            reply = await anext(replies)
        ended = True
        check_end(reply)
        answer = completion(run_id, reply, "".join(text), tool_calls)
        return JSONResponse(answer.model_dump(mode="json"))
    except streams.StreamTimeout as exc:
        raise ApiError(504, str(exc), "timeout") from None
    finally:
        if not handed_over:
            deps.replies.close(run_id)
            if not ended and abandon is not None:
                await asyncio.shield(abandon())


def check_end(reply: Reply) -> None:
    """A refusal or an engine failure becomes an HTTP error (before any byte of a stream is sent)."""
    if reply.kind == REJECTED:
        raise runs.rejection_error(reply.rejection)
    if reply.kind == "error":
        record = reply.delta
        raise ApiError(
            502,
            record["error_message"] or "The model failed.",
            record["error_code"] or "engine_error",
        )


async def cancel(deps: Services, user: Principal, event: PromptAccepted, reason: str) -> None:
    try:
        await runs.request_cancel(
            deps,
            run_id=event["run_id"],
            chat_id=event["chat_id"],
            user_id=user.user_id,
            reason=reason,
        )
    except Exception:
        log.exception("run %s: could not publish its cancel", event["run_id"])


def usage_of(record: TokenDelta) -> CompletionUsage:
    usage = record["usage"] or {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}
    return CompletionUsage(
        prompt_tokens=usage["prompt_tokens"],
        completion_tokens=usage["completion_tokens"],
        total_tokens=usage["prompt_tokens"] + usage["completion_tokens"],
        prompt_tokens_details=CachedTokens(cached_tokens=usage["cached_tokens"]),
    )


def finish_reason(end: TokenDelta) -> str:
    """OpenAI's name for how a run ended (a cancelled run stopped)."""
    reason = end.get("finish_reason") or "stop"
    return FINISH.get(reason, reason)


def completion(
    run_id: str, end: Reply, text: str, tool_calls: list[dict[str, Any]]
) -> ChatCompletion:
    record = end.delta
    message = AssistantMessage(
        content=text or (None if tool_calls else ""), tool_calls=tool_calls or None
    )
    choice = Choice(
        message=message,
        finish_reason=finish_reason(record),
    )
    return ChatCompletion(
        id=f"chatcmpl-{run_id}",
        created=int(time.time()),
        model=record["model"],
        choices=[choice],
        usage=usage_of(record),
    )


def chunk(
    run_id: str, model: str, created: int, delta: dict[str, Any], finish: str | None = None
) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{run_id}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }


def indexed(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A run's whole tool calls as one streamed delta: each with its index, arguments in one piece."""
    return [{"index": i, **call} for i, call in enumerate(calls)]


def data(payload: dict[str, Any]) -> dict[str, str]:
    """One SSE event of the OpenAI stream format (data only, no event name)."""
    return {"data": json.dumps(payload)}


async def chunk_stream(
    deps: Services,
    run_id: str,
    model: str | None,
    first: Reply,
    replies: AsyncIterator[Reply],
    include_usage: bool,
    abandon: Callable[[], Awaitable[None]] | None,
) -> AsyncIterator[dict[str, Any]]:
    created = int(time.time())
    opened = first.accepted if first.kind == ACCEPTED else first.delta  # never a refusal: check_end
    model = opened.get("model") or model or deps.settings.models[0]
    ended = False
    try:
        yield data(chunk(run_id, model, created, {"role": "assistant", "content": ""}))
        reply = first
        while True:
            if (
                reply.kind == "delta" and reply.delta["text"]
            ):  # an empty one is a keepalive (prefill)
                yield data(chunk(run_id, model, created, {"content": reply.delta["text"]}))
            if reply.kind == "delta" and (made := reply.delta.get("tool_calls")):
                calls = json.loads(made)
                yield data(chunk(run_id, model, created, {"tool_calls": indexed(calls)}))
            elif reply.kind in TERMINAL:
                ended = True
                if reply.kind != "completed":
                    failed = (
                        reply.rejection.get("message")
                        if reply.kind == REJECTED
                        else reply.delta.get("error_message")
                    )
                    message = failed or "The run failed."
                    yield data({"error": {"message": message, "type": "api_error", "code": None}})
                    return
                end = reply.delta
                finish = finish_reason(end)
                yield data(chunk(run_id, model, created, {}, finish))
                if include_usage:
                    usage = {
                        **chunk(run_id, model, created, {}),
                        "choices": [],
                        "usage": usage_of(end).model_dump(),
                    }
                    yield data(usage)
                yield {"data": "[DONE]"}
                return
            reply = await anext(replies)
    except streams.StreamTimeout as exc:
        ended = True
        yield data({"error": {"message": str(exc), "type": "api_error", "code": "timeout"}})
    finally:
        deps.replies.close(run_id)
        if not ended and abandon is not None:
            await asyncio.shield(abandon())
