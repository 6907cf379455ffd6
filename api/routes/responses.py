"""OpenAI's Responses API on the pipeline: `POST /v1/responses` (streamed as semantic events, or whole, or in the
background), `GET /v1/responses/{id}` (polled, or streamed again from any replica after `starting_after`),
`POST /v1/responses/{id}/cancel`, and `previous_response_id`.

A response is a run like any chat completion (moderated, scheduled, metered, in the log), whose request is
kept in `responses` (storage/responses.py) and whose records on its reply partition are its answer: any
replica rebuilds the response from them (api/responses.py), so a poll, a resumed stream or the next response
in a chain needs no copy of the output. Background mode is what the pipeline does anyway (a run outlives its
caller); without it, a client that goes away cancels its run, as on chat completions.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from sse_starlette.sse import EventSourceResponse

from api import runs, streams
from api.auth import CurrentUser
from api.deps import Deps, Services
from api.errors import ApiError
from api.openai_request import conversation, generation
from api.openapi import ENGINE_ERRORS, RESPONSE_EVENTS
from api.preferences import allowed_model
from api.redaction import HEADER, redacted_messages
from api.replies import TERMINAL, Replay, Reply
from api.responses import (
    Fold,
    ResponseObject,
    ResponsesRequest,
    completion_of,
    earlier_messages,
)
from api.routes.openai import cancel, check_end, conversation_key, tools_message
from storage.ids import id_time_ms, new_id
from storage.responses import StoredResponse
from topics import records

router = APIRouter(prefix="/v1/responses")
SNAPSHOT_S = 10.0


def response_id(run_id: str) -> str:
    return f"resp_{uuid.UUID(run_id).hex}"


def run_of(rid: str) -> uuid.UUID:
    try:
        return uuid.UUID(hex=rid.removeprefix("resp_"))
    except ValueError:
        raise not_found(rid) from None


def not_found(rid: str) -> ApiError:
    return ApiError(404, f"No response '{rid}' is stored for you.", "response_not_found")


async def owned(deps: Services, user_id: str, rid: str) -> StoredResponse:
    """The caller's stored response; another person's is as absent as one never made."""
    stored = await deps.responses.get(run_of(rid))
    if stored is None or stored.user_id != user_id:
        raise not_found(rid)
    return stored


def shown(body: ResponsesRequest, model: str, previous: str | None) -> dict[str, Any]:
    """The request's settings as the response object shows them."""
    return {
        "model": model,
        "instructions": body.instructions,
        "previous_response_id": previous,
        "background": body.background,
        "store": body.store,
        "tools": body.tools or [],
        "tool_choice": body.tool_choice or "auto",
        "parallel_tool_calls": body.parallel_tool_calls,
        "text": body.text or {"format": {"type": "text"}},
        "temperature": body.temperature,
        "top_p": body.top_p,
        "max_output_tokens": body.max_output_tokens,
        "truncation": "disabled",
        "metadata": body.metadata or {},
    }


def snapshot(deps: Services, stored: StoredResponse, after: bool = False) -> list[Reply]:
    """The response's records written so far, read from its reply partition (blocking: run in a thread)."""
    settings, run_id = deps.settings, str(stored.response_id)
    reader = Replay(settings.kafka_bootstrap, settings.namespace, stored.reply_partition, run_id)
    try:
        reader.seek(streams.since_ms(run_id), None)
        found: list[Reply] = []
        deadline = time.monotonic() + SNAPSHOT_S
        while time.monotonic() < deadline:
            reply = reader.poll(0.5)
            if reply is not None:
                found.append(reply)
                if reply.kind in TERMINAL:
                    break
            elif reader.caught_up():
                break
        return found
    finally:
        reader.close()


async def folded(deps: Services, stored: StoredResponse) -> Fold:
    fold = Fold(
        response_id(str(stored.response_id)),
        stored.request,
        id_time_ms(stored.response_id) // 1000,
    )
    fold.start()
    for reply in await asyncio.to_thread(snapshot, deps, stored):
        fold.feed(reply)
    return fold


async def earlier(deps: Services, user_id: str, previous: str | None) -> list[dict[str, Any]]:
    """The conversation a response continues: the previous one's messages and its output."""
    if previous is None:
        return []
    stored = await owned(deps, user_id, previous)
    fold = await folded(deps, stored)
    if not fold.ended:
        message = f"The previous response '{previous}' is still in progress; wait for it to end."
        raise ApiError(400, message, "previous_response_in_progress", "previous_response_id")
    instructed = bool(stored.request.get("instructions"))
    return earlier_messages(stored.messages, instructed, fold.output)


@router.post("", response_model=ResponseObject, responses={**RESPONSE_EVENTS, **ENGINE_ERRORS})
async def create(
    deps: Deps, user: CurrentUser, body: ResponsesRequest
) -> JSONResponse | EventSourceResponse:
    """A response, as the official client's `responses.create` asks: whole, streamed (`stream`), or at once
    with status queued (`background`: poll it, stream it with GET, cancel it)."""
    before = await earlier(deps, user.user_id, body.previous_response_id)
    request, completion = completion_of(body, before)
    messages, taken = redacted_messages(deps, user, conversation(deps.settings, completion))
    if taken:  # the stored request too: a later response continues from it
        request["messages"] = redacted_messages(deps, user, request["messages"], count=False)[0]
    decoding = generation(completion)
    max_tokens = runs.checked_max_tokens(deps.settings, body.max_output_tokens)
    model = allowed_model(deps.settings, deps.limits, user, body.model)
    run_id, partition = str(new_id()), runs.reply_partition(deps)
    chat_id = conversation_key(user.user_id, messages)
    settings = shown(body, model or deps.settings.models[0], body.previous_response_id)
    if body.store:
        stored = StoredResponse(
            uuid.UUID(run_id),
            user.user_id,
            uuid.UUID(chat_id),
            partition,
            settings["model"],
            request["messages"],
            settings,
            body.background,
            datetime.now(UTC),
        )
        await deps.responses.put(stored)  # before the run starts: a poll finds it at once
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
    sized = messages + tools_message(decoding)
    runs.shed_when_full(deps, user, run_id, model, sized, max_tokens, may_grow=False)
    try:
        live = await runs.start_run(deps, event)
    except Exception:
        deps.pools.decided(run_id)
        raise
    replies = aiter(streams.live(deps, run_id, partition, live))
    reply, replies = await runs.admitted(deps, event, replies, stream_refusals=False)
    fold = Fold(response_id(run_id), settings, id_time_ms(uuid.UUID(run_id)) // 1000)
    abandon = None if body.background else partial(cancel, deps, user, event, "client_disconnected")
    response: JSONResponse | EventSourceResponse
    if body.stream:
        events = stream(deps, run_id, fold, runs.prepend(reply, replies), -1, abandon)
        response = EventSourceResponse(events, ping=15)
    elif body.background:
        deps.replies.close(run_id)  # the run goes on; a poll reads it from the log
        fold.start()
        response = JSONResponse(fold.response())
    else:
        response = await whole(deps, run_id, fold, reply, replies, abandon)
    if taken:
        response.headers[HEADER] = ",".join(taken)
    return response


async def whole(
    deps: Services,
    run_id: str,
    fold: Fold,
    reply: Reply,
    replies: AsyncIterator[Reply],
    abandon: Callable[[], Awaitable[None]] | None,
) -> JSONResponse:
    ended = False
    try:
        check_end(reply)
        fold.start()
        fold.feed(reply)
        while not fold.ended:
            fold.feed(await anext(replies))
        ended = True
        return JSONResponse(fold.response())
    except streams.StreamTimeout as exc:
        raise ApiError(504, str(exc), "timeout") from None
    finally:
        deps.replies.close(run_id)
        if not ended and abandon is not None:
            await asyncio.shield(abandon())


async def stream(
    deps: Services,
    run_id: str,
    fold: Fold,
    replies: AsyncIterator[Reply],
    after: int,
    abandon: Callable[[], Awaitable[None]] | None,
) -> AsyncIterator[dict[str, str]]:
    """The semantic events (SSE `event:` type, JSON data), those numbered after `after` only."""
    ended = False

    def sent(events: list[dict[str, Any]]) -> list[dict[str, str]]:
        return [
            {"event": e["type"], "data": json.dumps(e)}
            for e in events
            if e["sequence_number"] > after
        ]

    try:
        for item in sent(fold.start()):
            yield item
        async for reply in replies:
            for item in sent(fold.feed(reply)):
                yield item
            if fold.ended:
                break
        ended = True
    except streams.StreamTimeout as exc:
        ended = True
        error = {
            "type": "error",
            "code": "timeout",
            "message": str(exc),
            "sequence_number": fold.seq,
        }
        yield {"event": "error", "data": json.dumps(error)}
    finally:
        deps.replies.close(run_id)
        if not ended and abandon is not None:
            await asyncio.shield(abandon())


@router.get("/{rid}", response_model=ResponseObject, responses=RESPONSE_EVENTS)
async def retrieve(
    deps: Deps,
    user: CurrentUser,
    rid: str,
    stream_: Annotated[bool, Query(alias="stream")] = False,
    starting_after: Annotated[int | None, Query(ge=-1)] = None,
) -> JSONResponse | EventSourceResponse:
    """The response as it stands (a background one may still be queued or in progress); with `stream=true`,
    its events again from the log, after `starting_after` (any replica; live until it ends)."""
    stored = await owned(deps, user.user_id, rid)
    if not stream_:
        return JSONResponse((await folded(deps, stored)).response())
    run_id = str(stored.response_id)
    replies = streams.from_log(deps, stored.reply_partition, run_id, None)
    fold = Fold(rid, stored.request, id_time_ms(stored.response_id) // 1000)
    after = -1 if starting_after is None else starting_after
    return EventSourceResponse(stream(deps, run_id, fold, replies, after, None), ping=15)


@router.post("/{rid}/cancel", response_model=ResponseObject)
async def cancel_response(deps: Deps, user: CurrentUser, rid: str) -> JSONResponse:
    """Stop a background response between decode steps; it ends with status cancelled (poll it). One that has
    ended already is returned as it is."""
    stored = await owned(deps, user.user_id, rid)
    if not stored.background:
        message = "Only a background response can be cancelled."
        raise ApiError(400, message, "invalid_value", "background")
    fold = await folded(deps, stored)
    if not fold.ended:
        await runs.request_cancel(
            deps,
            run_id=str(stored.response_id),
            chat_id=str(stored.conversation),
            user_id=user.user_id,
            reason="user",
        )
    return JSONResponse(fold.response())
