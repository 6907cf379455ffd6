"""Chats, messages and runs: create, list by recent activity, read, rename, delete, export; post a message that
streams its answer as SSE; resume a run's stream from any replica; cancel a run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Response
from prometheus_client import Counter, Gauge, Histogram
from pydantic import BaseModel, Field
from sse_starlette.sse import EventSourceResponse

from api import convert, streams
from api.app import Deps, Services
from api.auth import CurrentUser, Principal
from api.errors import ApiError
from api.replies import TERMINAL, Reply, parse_cursor
from storage.ids import decode_cursor, encode_cursor, new_id, parse_id, utc
from topics.pipeline import FEEDBACK, MEMORY_CHANGED

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/chats")

EDGE_TTFT = Histogram(
    "parley_edge_ttft_seconds", "Accept to first token at the edge", buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10)
)
STREAMS = Gauge("parley_edge_open_streams", "SSE streams open on this replica")
RUNS = Counter("parley_edge_runs_total", "Runs opened on this replica", ["outcome"])


class NewChat(BaseModel):
    title: str = Field("New chat", max_length=200)


class ChatPatch(BaseModel):
    title: str = Field(min_length=1, max_length=200)


class MessagePatch(BaseModel):
    content: str = Field(min_length=1)


class NewMessage(BaseModel):
    content: str
    max_tokens: int | None = Field(None, ge=1)
    model: str | None = None


async def owned_chat(deps: Services, user: Principal, chat_id: str) -> tuple[uuid.UUID, Any]:
    """The chat if it exists and belongs to the caller; otherwise 404 (never 403: no existence leak)."""
    parsed = parse_id(chat_id)
    row = await deps.conversations.get_chat(parsed) if parsed else None
    if row is None or row.user_id != user.user_id:
        raise ApiError(404, f"No chat found with id '{chat_id}'.", "chat_not_found")
    assert parsed is not None
    return parsed, row


def cursor_id(cursor: str | None) -> uuid.UUID | None:
    if not cursor:
        return None
    value = decode_cursor(cursor)
    after = parse_id(value.get("after", "")) if value else None
    if after is None:
        raise ApiError(400, "The cursor is not valid.", "invalid_cursor", "cursor")
    return after


def chat_json(row: Any) -> dict[str, Any]:
    active = row.last_active_at if hasattr(row, "last_active_at") else row.active_at
    return {
        "id": str(row.chat_id),
        "object": "chat",
        "title": row.title,
        "created_at": utc(row.created_at).isoformat(),
        "last_active_at": utc(active or row.created_at).isoformat(),
    }


def activity_cursor(cursor: str | None) -> tuple[datetime, uuid.UUID] | None:
    if not cursor:
        return None
    value = decode_cursor(cursor)
    after = parse_id(value.get("after", "")) if value else None
    at = value.get("at") if value else None
    if after is None or not isinstance(at, int):
        raise ApiError(400, "The cursor is not valid.", "invalid_cursor", "cursor")
    return datetime.fromtimestamp(at / 1000, UTC), after


@router.post("", status_code=201)
async def create_chat(deps: Deps, user: CurrentUser, body: NewChat | None = None) -> dict[str, Any]:
    title = body.title if body else "New chat"
    chat_id, created = await deps.conversations.create_chat(user.user_id, title)
    iso = created.isoformat()
    return {"id": str(chat_id), "object": "chat", "title": title, "created_at": iso, "last_active_at": iso}


Limit = Annotated[int, Query(ge=1, le=100, description="how many per page")]


@router.get("")
async def list_chats(deps: Deps, user: CurrentUser, cursor: str | None = None, limit: Limit = 20) -> dict[str, Any]:
    """The caller's chats, most recently active first (a new message moves a chat to the top)."""
    rows = await deps.conversations.list_chats(user.user_id, limit + 1, activity_cursor(cursor))
    page = rows[:limit]
    next_cursor = None
    if len(rows) > limit:
        last = page[-1]
        next_cursor = encode_cursor({"at": int(utc(last.active_at).timestamp() * 1000), "after": str(last.chat_id)})
    return {"data": [chat_json(r) for r in page], "next_cursor": next_cursor}


@router.get("/export")
async def export_chats(deps: Deps, user: CurrentUser) -> dict[str, Any]:
    """Every chat of the caller with all its messages, as one JSON document."""
    chats: list[dict[str, Any]] = []
    after: tuple[datetime, uuid.UUID] | None = None
    while True:
        rows = await deps.conversations.list_chats(user.user_id, 100, after)
        for row in rows:
            messages, last = [], None
            while True:
                page = await deps.conversations.list_messages(row.chat_id, 500, last)
                messages += [convert.message_json(m) for m in page]
                if len(page) < 500:
                    break
                last = uuid.UUID(page[-1].id)
            chats.append({**chat_json(row), "messages": messages})
        if len(rows) < 100:
            break
        after = (rows[-1].active_at, rows[-1].chat_id)
    exported = datetime.now(UTC).isoformat()
    return {"object": "export", "user_id": user.user_id, "exported_at": exported, "chats": chats}


@router.get("/{chat_id}")
async def get_chat(deps: Deps, user: CurrentUser, chat_id: str) -> dict[str, Any]:
    """The chat, with `active_run_id` while its latest run is still answering (a reloaded page resumes it)."""
    parsed, chat = await owned_chat(deps, user, chat_id)
    run = await deps.conversations.get_run(parsed, uuid.UUID(chat.last_run_id)) if chat.last_run_id else None
    return {**chat_json(chat), "active_run_id": chat.last_run_id if run and run[1] is None else None}


@router.patch("/{chat_id}")
async def rename_chat(deps: Deps, user: CurrentUser, chat_id: str, body: ChatPatch) -> dict[str, Any]:
    _, chat = await owned_chat(deps, user, chat_id)
    await deps.conversations.rename_chat(chat, body.title)
    return {**chat_json(chat), "title": body.title}


@router.delete("/{chat_id}", status_code=204)
async def delete_chat(deps: Deps, user: CurrentUser, chat_id: str) -> Response:
    """The chat with its messages and runs; its streams can no longer be resumed (404)."""
    _, chat = await owned_chat(deps, user, chat_id)
    await deps.memory.reset(chat.chat_id)  # its embeddings and summaries first: the chat row goes last
    await deps.conversations.delete_chat(chat)
    log.info("chat %s deleted by %s", chat_id, user.user_id)
    return Response(status_code=204)


@router.get("/{chat_id}/messages")
async def list_messages(
    deps: Deps, user: CurrentUser, chat_id: str, cursor: str | None = None, limit: Limit = 50
) -> dict[str, Any]:
    parsed, _ = await owned_chat(deps, user, chat_id)
    rows = await deps.conversations.list_messages(parsed, limit + 1, cursor_id(cursor))
    page = rows[:limit]
    more = len(rows) > limit
    return {
        "data": [convert.message_json(m) for m in page],
        "next_cursor": encode_cursor({"after": page[-1].id}) if more else None,
    }


async def owned_message(deps: Services, chat_id: uuid.UUID, message_id: str) -> Any:
    parsed = parse_id(message_id)
    message = await deps.conversations.get_message(chat_id, parsed) if parsed else None
    if message is None and parsed and await deps.conversations.get_run(chat_id, parsed) is not None:
        # An answer (its id is its run's) whose stream the client saw end, not stored yet: the persistence stage
        # writes it a moment after the run's last record. Wait for it rather than answer 404 for what exists.
        deadline = time.monotonic() + deps.settings.answer_store_wait_s
        while message is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            message = await deps.conversations.get_message(chat_id, parsed)
        if message is None:
            retry = {"Retry-After": "1"}
            raise ApiError(409, "This answer is still being written; retry shortly.", "run_in_progress", headers=retry)
    if message is None:
        raise ApiError(404, f"No message found with id '{message_id}' in this chat.", "message_not_found")
    return message


async def memory_changed(deps: Services, chat_id: uuid.UUID, user: Principal, action: str, **fields: Any) -> None:
    """Tell the memory stage (it re-embeds an edited message and summarises again)."""
    event = {
        "event_id": str(uuid.uuid4()),
        "chat_id": str(chat_id),
        "user_id": user.user_id,
        "action": action,
        "message_id": fields.get("message_id"),
        "role": fields.get("role"),
        "content": fields.get("content"),
        "at": int(time.time() * 1000),
    }
    await deps.producer.publish(MEMORY_CHANGED, event, key=str(chat_id))


@router.patch("/{chat_id}/messages/{message_id}")
async def edit_message(
    deps: Deps, user: CurrentUser, chat_id: str, message_id: str, body: MessagePatch
) -> dict[str, Any]:
    """Change a message's text. Memory follows: its old embedding and every summary covering it are dropped
    now (the next prompt sees neither), and the memory stage embeds the new text and summarises again."""
    checked_content(deps, body.content)
    parsed, _ = await owned_chat(deps, user, chat_id)
    message = await owned_message(deps, parsed, message_id)
    mid = uuid.UUID(message.id)
    await deps.conversations.edit_message(parsed, mid, body.content)
    await deps.memory.forget(parsed, mid)
    await deps.memory.drop_summaries_covering(parsed, mid)
    await memory_changed(deps, parsed, user, "edited", message_id=message.id, role=message.role, content=body.content)
    log.info("chat %s: message %s edited by %s", chat_id, message.id, user.user_id)
    return convert.message_json(replace(message, content=body.content))


async def forget_message(deps: Services, chat_id: uuid.UUID, user: Principal, message: Any) -> None:
    """Delete a stored message with its embedding and every summary that covers it, and tell the memory stage."""
    mid = uuid.UUID(message.id)
    await deps.conversations.delete_message(chat_id, mid)
    await deps.memory.forget(chat_id, mid)
    await deps.memory.drop_summaries_covering(chat_id, mid)
    await memory_changed(deps, chat_id, user, "deleted", message_id=message.id, role=message.role)


@router.delete("/{chat_id}/messages/{message_id}", status_code=204)
async def delete_message(deps: Deps, user: CurrentUser, chat_id: str, message_id: str) -> Response:
    """Delete a message, with its embedding and every summary that covers it."""
    parsed, _ = await owned_chat(deps, user, chat_id)
    message = await owned_message(deps, parsed, message_id)
    await forget_message(deps, parsed, user, message)
    log.info("chat %s: message %s deleted by %s", chat_id, message.id, user.user_id)
    return Response(status_code=204)


@router.post("/{chat_id}/context/reset")
async def reset_context(deps: Deps, user: CurrentUser, chat_id: str) -> dict[str, Any]:
    """Start the chat's context afresh: its messages stay listed, but later prompts carry none of them, no
    summary and no retrieved memory."""
    parsed, _ = await owned_chat(deps, user, chat_id)
    marker = await deps.conversations.reset_context(parsed)
    await deps.memory.reset(parsed)
    await memory_changed(deps, parsed, user, "reset")
    log.info("chat %s: context reset by %s", chat_id, user.user_id)
    return {"id": chat_id, "object": "chat.context", "context_from": str(marker)}


@router.post("/{chat_id}/messages")
async def post_message(deps: Deps, user: CurrentUser, chat_id: str, body: NewMessage) -> EventSourceResponse:
    content = body.content.strip()
    if not content:
        raise ApiError(400, "content must not be empty.", "empty_content", "content")
    checked_content(deps, body.content)
    max_tokens = checked_max_tokens(deps, body.max_tokens)
    checked_model(deps, body.model)
    parsed, chat = await owned_chat(deps, user, chat_id)
    question = Question(str(new_id()), body.content, chat.last_run_id)  # sorts before the answer (the run's id)
    response, _ = await answer(deps, user, chat, question, max_tokens, body.model)
    return response


async def withdraw(deps: Services, chat: Any, run_id: uuid.UUID, opened_at: datetime) -> None:
    """The run the log did not take: ended, and no longer the chat's latest (best effort: the store may be
    down too, and then the run stays listed as unfinished, with nothing behind it)."""
    try:
        await deps.conversations.withdraw_run(chat, run_id, opened_at)
    except Exception:
        log.warning("run %s of chat %s: the log did not take it, nor the store its withdrawal", run_id, chat.chat_id)


@dataclass(frozen=True)
class Question:
    message_id: str
    content: str
    prev_run_id: str | None  # the chat's answer before it (the scheduler waits until that one is stored)


async def answer(
    deps: Services, user: Principal, chat: Any, question: Question, max_tokens: int, model: str | None
) -> tuple[EventSourceResponse, str]:
    """Publish the question as a new run of the chat and stream its answer: (the SSE response, the run id).
    Raises the run's 429/400 before any byte of the stream when it is shed or refused."""
    message = [{"role": "user", "content": question.content}]
    streams.shed_when_full(deps, user, model, message, max_tokens, may_grow=question.prev_run_id is not None)
    run_id, partition = str(new_id()), streams.reply_partition(deps)
    event = convert.prompt_accepted(
        run_id=run_id,
        chat_id=str(chat.chat_id),
        user_id=user.user_id,
        tier=user.tier,
        message_id=question.message_id,
        content=question.content,
        max_tokens=max_tokens,
        model=model,
        reply_partition=partition,
        prev_run_id=question.prev_run_id,
    )
    # Recorded before the prompt goes to the log: a store that does not answer refuses the request with nothing
    # in the log (the other way round, a question refused 503 was stored and answered anyway), and a cancel or
    # a resume finds the run from its first event. A log that does not take the prompt withdraws the run.
    opened_at = await deps.conversations.open_run(chat, uuid.UUID(run_id), partition)
    try:
        live = await streams.start_run(deps, event)
    except Exception:
        await asyncio.shield(withdraw(deps, chat, uuid.UUID(run_id), opened_at))
        raise
    replies = aiter(streams.live(deps, run_id, partition, live))
    first, replies = await streams.admitted(deps, event, replies, stream_refusals=True)
    log.info("run %s of chat %s (user %s): %s", run_id, chat.chat_id, user.user_id, first.kind)
    stream = sse_stream(deps, run_id, streams.prepend(first, replies), live=True)
    return EventSourceResponse(stream, ping=15, headers={"X-Run-Id": run_id}), run_id


def checked_content(deps: Services, content: str) -> None:
    """A message's text, sent or edited, is at most `max_content_chars` long (checked before anything is written)."""
    limit = deps.settings.max_content_chars
    if len(content) > limit:
        raise ApiError(400, f"content is longer than {limit} characters.", "content_too_long", "content")


def checked_max_tokens(deps: Services, requested: int | None) -> int:
    max_tokens = requested or deps.settings.default_max_tokens
    if max_tokens > deps.settings.max_tokens_limit:
        raise ApiError(
            400, f"max_tokens must be at most {deps.settings.max_tokens_limit}.", "invalid_value", "max_tokens"
        )
    return max_tokens


def checked_model(deps: Services, model: str | None) -> None:
    if model is not None and model not in deps.settings.models:
        raise ApiError(400, f"Unknown model '{model}'.", "model_not_found", "model")


def error_event(run_id: str, code: str, message: str) -> dict[str, Any]:
    """An SSE `error` event the edge itself raises (no log record behind it, so no cursor)."""
    return {"event": "error", "data": json.dumps({"run_id": run_id, "code": code, "message": message})}


async def sse_stream(
    deps: Services, run_id: str, replies: AsyncIterator[Reply], live: bool
) -> AsyncIterator[dict[str, Any]]:
    """The chat route's SSE events for a run's replies (live from the hub, or read back from the log)."""
    accepted = time.perf_counter()
    first_token = live
    STREAMS.inc()
    try:
        async for reply in replies:
            if reply.kind == "delta" and first_token:
                EDGE_TTFT.observe(time.perf_counter() - accepted)
                first_token = False
            yield convert.sse(reply)
            if reply.kind in TERMINAL and live:
                RUNS.labels(reply.kind).inc()
    except streams.StreamTimeout as exc:
        RUNS.labels("timeout").inc()
        yield error_event(run_id, "timeout", str(exc))
    except streams.ForeignCursor:
        yield error_event(run_id, "invalid_last_event_id", "The cursor is not of this run.")
    finally:
        STREAMS.dec()
        if live:
            deps.replies.close(run_id)


async def owned_run(deps: Services, user: Principal, chat_id: str, run_id: str) -> tuple[Any, int, str | None]:
    """(the chat, reply partition, finish reason) of a run of one of the caller's chats; otherwise 404."""
    parsed, chat = await owned_chat(deps, user, chat_id)
    run = parse_id(run_id)
    state = await deps.conversations.get_run(parsed, run) if run else None
    if state is None:
        raise ApiError(404, f"No run found with id '{run_id}' in this chat.", "run_not_found")
    return chat, state[0], state[1]


@router.get("/{chat_id}/runs/{run_id}/events")
async def run_events(
    deps: Deps,
    user: CurrentUser,
    chat_id: str,
    run_id: str,
    last_event_id: Annotated[str | None, Header()] = None,
) -> EventSourceResponse:
    """Replay a run's stream from the log: whole, or after the Last-Event-ID cursor; live until it ends.

    Works on any edge replica, after an edge restart, and from several devices at once.
    """
    _, partition, _ = await owned_run(deps, user, chat_id, run_id)
    after = None
    if last_event_id is not None:
        after = parse_cursor(last_event_id.strip())
        if after is None or after[1] != partition:
            raise ApiError(400, "Last-Event-ID is not a cursor of this run's stream.", "invalid_last_event_id")
    replies = streams.from_log(deps, partition, str(uuid.UUID(run_id)), after)
    return EventSourceResponse(sse_stream(deps, run_id, replies, live=False), ping=15)


@router.post("/{chat_id}/runs/{run_id}/cancel", status_code=202)
async def cancel_run(deps: Deps, user: CurrentUser, chat_id: str, run_id: str) -> dict[str, Any]:
    """Stop a run between decode steps; it completes with finish_reason "cancelled", its partial answer stored."""
    chat, _, finish_reason = await owned_run(deps, user, chat_id, run_id)
    if finish_reason is not None:
        raise ApiError(409, f"The run already finished ({finish_reason}).", "run_already_finished")
    await streams.request_cancel(
        deps, run_id=str(uuid.UUID(run_id)), chat_id=str(chat.chat_id), user_id=user.user_id, reason="user"
    )
    return {"id": run_id, "object": "run", "status": "cancelling"}


class Regenerate(BaseModel):
    max_tokens: int | None = Field(None, ge=1)
    model: str | None = None


@router.post("/{chat_id}/runs/{run_id}/regenerate")
async def regenerate(
    deps: Deps, user: CurrentUser, chat_id: str, run_id: str, body: Regenerate | None = None
) -> EventSourceResponse:
    """Answer the chat's latest question again, as a new run streamed like a new message. Only the latest run,
    once it has ended. The question keeps its place (same message id, so the scheduler's context is what the
    first answer saw); the old answer is deleted, with its memory, once the new run is admitted."""
    body = body or Regenerate()
    max_tokens = checked_max_tokens(deps, body.max_tokens)
    checked_model(deps, body.model)
    chat, _, finish_reason = await owned_run(deps, user, chat_id, run_id)
    parsed = chat.chat_id
    old = str(uuid.UUID(run_id))
    if chat.last_run_id != old:
        raise ApiError(409, "Only the chat's latest answer can be regenerated.", "not_latest_run")
    if finish_reason is None:
        raise ApiError(409, "The run is still answering; stop it first.", "run_in_progress")
    recent = await deps.conversations.messages_after(parsed, None, 4)  # the newest, oldest first
    asked = [i for i, m in enumerate(recent) if m.role == "user" and m.run_id == old]
    if not asked:
        raise ApiError(409, "The question of this answer is no longer stored.", "question_not_found")
    at = asked[-1]
    earlier = recent[at - 1].id if at > 0 else None
    question = Question(recent[at].id, recent[at].content, earlier)
    response, new_run = await answer(deps, user, chat, question, max_tokens, body.model)
    previous = next((m for m in recent if m.id == old), None)
    if previous is not None:
        await forget_message(deps, parsed, user, previous)
    log.info("chat %s: run %s regenerated as %s by %s", chat_id, old, new_run, user.user_id)
    return response


class NewFeedback(BaseModel):
    rating: Literal["up", "down"] | None = Field(description="null takes a rating back")
    comment: str | None = Field(None, max_length=2000)


@router.post("/{chat_id}/messages/{message_id}/feedback", status_code=202)
async def feedback(deps: Deps, user: CurrentUser, chat_id: str, message_id: str, body: NewFeedback) -> dict[str, Any]:
    """Thumbs up or down on an answer: a Feedback event (kept in the log for evals); the persistence stage shows
    it on the stored answer."""
    parsed, _ = await owned_chat(deps, user, chat_id)
    message = await owned_message(deps, parsed, message_id)
    if message.role != "assistant":
        raise ApiError(400, "Only an answer can be rated.", "invalid_value", "message_id")
    event = {
        "event_id": str(uuid.uuid4()),
        "chat_id": str(parsed),
        "user_id": user.user_id,
        "message_id": message.id,
        "rating": body.rating or "none",
        "comment": body.comment,
        "model": message.model,
        "at": int(time.time() * 1000),
    }
    await deps.producer.publish(FEEDBACK, event, key=str(parsed))
    log.info("chat %s: answer %s rated %s by %s", chat_id, message.id, event["rating"], user.user_id)
    return {"id": message.id, "object": "feedback", "rating": body.rating}
