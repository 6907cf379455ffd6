"""Chats and messages: create, list, read, and post a message that streams its answer as SSE."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header
from opentelemetry import trace
from prometheus_client import Counter, Gauge, Histogram
from pydantic import BaseModel, Field
from sse_starlette.sse import EventSourceResponse

from api import convert
from api.app import Deps, Services
from api.auth import CurrentUser, Principal
from api.errors import ApiError
from api.replies import Replay, parse_cursor
from storage.cassandra import decode_cursor, encode_cursor, new_id, parse_id, utc
from topics import codec
from topics.pipeline import PROMPT_ACCEPTED, named

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/chats")

EDGE_TTFT = Histogram(
    "parley_edge_ttft_seconds", "Accept to first token at the edge", buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10)
)
STREAMS = Gauge("parley_edge_open_streams", "SSE streams open on this replica")
RUNS = Counter("parley_edge_runs_total", "Runs opened on this replica", ["outcome"])


class NewChat(BaseModel):
    title: str = Field("New chat", max_length=200)


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


def page_limit(limit: int) -> int:
    if not 1 <= limit <= 100:
        raise ApiError(400, "limit must be between 1 and 100.", "invalid_value", "limit")
    return limit


def cursor_id(cursor: str | None) -> uuid.UUID | None:
    if not cursor:
        return None
    value = decode_cursor(cursor)
    after = parse_id(value.get("after", "")) if value else None
    if after is None:
        raise ApiError(400, "The cursor is not valid.", "invalid_cursor", "cursor")
    return after


@router.post("", status_code=201)
async def create_chat(deps: Deps, user: CurrentUser, body: NewChat | None = None) -> dict[str, Any]:
    title = body.title if body else "New chat"
    chat_id, created = await deps.conversations.create_chat(user.user_id, title)
    return {"id": str(chat_id), "object": "chat", "title": title, "created_at": created.isoformat()}


@router.get("")
async def list_chats(deps: Deps, user: CurrentUser, cursor: str | None = None, limit: int = 20) -> dict[str, Any]:
    limit = page_limit(limit)
    rows = await deps.conversations.list_chats(user.user_id, limit + 1, cursor_id(cursor))
    page = rows[:limit]
    data = [{"id": str(r.chat_id), "title": r.title, "created_at": utc(r.created_at).isoformat()} for r in page]
    more = len(rows) > limit
    return {"data": data, "next_cursor": encode_cursor({"after": data[-1]["id"]}) if more else None}


@router.get("/{chat_id}/messages")
async def list_messages(
    deps: Deps, user: CurrentUser, chat_id: str, cursor: str | None = None, limit: int = 50
) -> dict[str, Any]:
    parsed, _ = await owned_chat(deps, user, chat_id)
    limit = page_limit(limit)
    rows = await deps.conversations.list_messages(parsed, limit + 1, cursor_id(cursor))
    page = rows[:limit]
    more = len(rows) > limit
    return {
        "data": [convert.message_json(m) for m in page],
        "next_cursor": encode_cursor({"after": page[-1].id}) if more else None,
    }


@router.post("/{chat_id}/messages")
async def post_message(deps: Deps, user: CurrentUser, chat_id: str, body: NewMessage) -> EventSourceResponse:
    settings = deps.settings
    content = body.content.strip()
    if not content:
        raise ApiError(400, "content must not be empty.", "empty_content", "content")
    if len(body.content) > settings.max_content_chars:
        raise ApiError(
            400, f"content is longer than {settings.max_content_chars} characters.", "content_too_long", "content"
        )
    max_tokens = body.max_tokens or settings.default_max_tokens
    if max_tokens > settings.max_tokens_limit:
        raise ApiError(400, f"max_tokens must be at most {settings.max_tokens_limit}.", "invalid_value", "max_tokens")
    if body.model is not None and body.model not in settings.models:
        raise ApiError(400, f"Unknown model '{body.model}'.", "model_not_found", "model")
    parsed, chat = await owned_chat(deps, user, chat_id)

    message_id, run_id = str(new_id()), str(new_id())
    event = convert.prompt_accepted(
        run_id=run_id,
        chat_id=str(parsed),
        user_id=user.user_id,
        tier=user.tier,
        message_id=message_id,
        content=body.content,
        max_tokens=max_tokens,
        model=body.model,
        reply_partition=deps.replies.partition,
        prev_run_id=chat.last_run_id,
    )
    queue = deps.replies.open(run_id)  # before publishing, so no reply can be missed
    tracer = trace.get_tracer("parley-api")
    try:
        with tracer.start_as_current_span("accept prompt", kind=trace.SpanKind.PRODUCER) as span:
            span.set_attribute("parley.run_id", run_id)
            await deps.producer.send(
                named(PROMPT_ACCEPTED, settings.namespace), codec.encode(PROMPT_ACCEPTED.schema, event), key=str(parsed)
            )
        await deps.conversations.open_run(parsed, uuid.UUID(run_id), deps.replies.partition)
    except Exception:
        deps.replies.close(run_id)
        raise
    log.info("run %s accepted for chat %s (user %s)", run_id, parsed, user.user_id)
    return EventSourceResponse(stream(deps, run_id, queue), ping=15)


def error_event(run_id: str, code: str, message: str) -> dict[str, Any]:
    """An SSE `error` event the edge itself raises (no log record behind it, so no cursor)."""
    return {"event": "error", "data": json.dumps({"run_id": run_id, "code": code, "message": message})}


async def stream(deps: Services, run_id: str, queue: asyncio.Queue[Any]) -> AsyncIterator[dict[str, Any]]:
    accepted = time.perf_counter()
    first_token = True
    timeout = deps.settings.first_event_timeout_s
    STREAMS.inc()
    try:
        while True:
            try:
                reply = await asyncio.wait_for(queue.get(), timeout)
            except TimeoutError:
                RUNS.labels("timeout").inc()
                yield error_event(run_id, "timeout", f"No progress on this run for {timeout:.0f}s.")
                return
            timeout = deps.settings.stream_idle_timeout_s
            if reply.kind == "delta" and first_token:
                EDGE_TTFT.observe(time.perf_counter() - accepted)
                first_token = False
            yield convert.sse(reply)
            if reply.kind in convert.TERMINAL:
                RUNS.labels(reply.kind).inc()
                return
    finally:
        STREAMS.dec()
        deps.replies.close(run_id)


UUID_EPOCH_100NS = 0x01B21DD213814000  # 1582-10-15 -> 1970-01-01 in the 100 ns units of a version-1 uuid
REPLAY_MARGIN_MS = 5_000  # clock skew between the edge that minted the run id and the producers' timestamps


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
    parsed, _ = await owned_chat(deps, user, chat_id)
    run = parse_id(run_id)
    partition = await deps.conversations.run_partition(parsed, run) if run else None
    if run is None or partition is None:
        raise ApiError(404, f"No run found with id '{run_id}' in this chat.", "run_not_found")
    after = None
    if last_event_id is not None:
        after = parse_cursor(last_event_id.strip())
        if after is None or after[1] != partition:
            raise ApiError(400, "Last-Event-ID is not a cursor of this run's stream.", "invalid_last_event_id")
    since_ms = (run.time - UUID_EPOCH_100NS) // 10_000 - REPLAY_MARGIN_MS
    return EventSourceResponse(replay(deps, partition, run_id, since_ms, after), ping=15)


async def replay(
    deps: Services, partition: int, run_id: str, since_ms: int, after: tuple[str, int, int] | None
) -> AsyncIterator[dict[str, Any]]:
    if after is not None and after[0] == "r":
        return  # the client already has the run's terminal record (a rejection)
    loop = asyncio.get_running_loop()
    settings = deps.settings
    reader = Replay(settings.kafka_bootstrap, settings.namespace, partition, run_id)
    try:
        await loop.run_in_executor(None, reader.seek, since_ms, after)
        deadline = loop.time() + settings.first_event_timeout_s
        while True:
            try:
                reply = await loop.run_in_executor(None, reader.poll, 0.5)
            except ValueError:
                yield error_event(run_id, "invalid_last_event_id", "The cursor is not of this run.")
                return
            if reader.finished:
                return
            if reply is None:
                if loop.time() > deadline:
                    yield error_event(run_id, "timeout", "No progress on this run.")
                    return
                continue
            deadline = loop.time() + settings.stream_idle_timeout_s
            yield convert.sse(reply)
            if reply.kind in convert.TERMINAL:
                return
    finally:
        await loop.run_in_executor(None, reader.close)
