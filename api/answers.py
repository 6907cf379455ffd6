"""A question answered as a run of its chat: published to the log, admitted, and its replies streamed as SSE;
and the checks a question passes before anything is written. Used by a new message and by a regenerate."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from sse_starlette.sse import EventSourceResponse

from api import convert, streams
from api.auth import Principal
from api.deps import Services
from api.errors import ApiError
from api.replies import TERMINAL, Reply
from storage.ids import new_id
from storage.withdrawals import TAKEN, WITHDRAW_TIMEOUT_S, WITHDRAWN

log = logging.getLogger(__name__)

EDGE_TTFT = Histogram(
    "parley_edge_ttft_seconds",
    "Accept to first token at the edge",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
)
STREAMS = Gauge("parley_edge_open_streams", "SSE streams open on this replica")
RUNS = Counter("parley_edge_runs_total", "Runs opened on this replica", ["outcome"])


async def withdraw(deps: Services, chat: Any, run_id: uuid.UUID, opened_at: datetime) -> bool:
    """The run whose prompt the log did not acknowledge: withdrawn (ended, and no longer the chat's latest), and
    True; or False when the scheduler had taken it first (the log had it after all: storage/withdrawals.py).
    Best effort: with the store down too, the run stays listed as unfinished, with nothing behind it."""
    try:
        fate = await asyncio.wait_for(
            deps.conversations.settle_fate(chat.chat_id, run_id, WITHDRAWN), WITHDRAW_TIMEOUT_S
        )
        if fate == TAKEN:
            log.warning(
                "run %s of chat %s: the log did not acknowledge it, yet it was taken",
                run_id,
                chat.chat_id,
            )
            return False
        await deps.conversations.withdraw_run(chat, run_id, opened_at)
    except Exception:
        log.warning(
            "run %s of chat %s: the log did not take it, nor the store its withdrawal",
            run_id,
            chat.chat_id,
        )
    return True


async def leave_old_place(deps: Services, chat: Any) -> None:
    """Best effort: a stale activity row left behind is skipped by every list (storage/conversations.py)."""
    try:
        await deps.conversations.leave_old_place(chat)
    except Exception:
        log.warning(
            "chat %s: its old place in the list was not removed (lists skip it)", chat.chat_id
        )


@dataclass(frozen=True)
class Question:
    message_id: str
    content: str
    prev_run_id: (
        str | None
    )  # the chat's answer before it (the scheduler waits until that one is stored)


async def answer(
    deps: Services,
    user: Principal,
    chat: Any,
    question: Question,
    max_tokens: int,
    model: str | None,
) -> tuple[EventSourceResponse, str]:
    """Publish the question as a new run of the chat and stream its answer: (the SSE response, the run id).
    Raises the run's 429/400 before any byte of the stream when it is shed or refused."""
    message = [{"role": "user", "content": question.content}]
    run_id, partition = str(new_id()), streams.reply_partition(deps)
    may_grow = question.prev_run_id is not None
    streams.shed_when_full(deps, user, run_id, model, message, max_tokens, may_grow=may_grow)
    # Recorded before the prompt goes to the log: a store that does not answer refuses the request with nothing
    # in the log (the other way round, a question refused 503 was stored and answered anyway), and a cancel or
    # a resume finds the run from its first event. A log that does not take the prompt withdraws the run.
    try:
        opened_at = await deps.conversations.open_run(chat, uuid.UUID(run_id), partition)
    except Exception:
        deps.pools.decided(run_id)  # never reached the log: the door stops counting it
        raise
    # Made after the store's write: its time is when it was published, which a stage reading it much later
    # compares with the producer's delivery timeout (storage/withdrawals.py).
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
    tidy = asyncio.create_task(leave_old_place(deps, chat))  # beside the publish, not before it
    try:
        live = await streams.start_run(deps, event)
        replies = aiter(streams.live(deps, run_id, partition, live))
    except Exception:
        deps.pools.decided(run_id)
        if await asyncio.shield(withdraw(deps, chat, uuid.UUID(run_id), opened_at)):
            raise
        replies = aiter(
            streams.from_log(deps, partition, run_id, None)
        )  # taken: its replies are in the log
    finally:
        await tidy
    first, replies = await streams.admitted(deps, event, replies, stream_refusals=True)
    log.info("run %s of chat %s (user %s): %s", run_id, chat.chat_id, user.user_id, first.kind)
    stream = sse_stream(deps, run_id, streams.prepend(first, replies), live=True)
    return EventSourceResponse(stream, ping=15, headers={"X-Run-Id": run_id}), run_id


def checked_content(deps: Services, content: str) -> None:
    """A message's text, sent or edited, is at most `max_content_chars` long (checked before anything is written)."""
    limit = deps.settings.max_content_chars
    if len(content) > limit:
        raise ApiError(
            400, f"content is longer than {limit} characters.", "content_too_long", "content"
        )


def checked_max_tokens(deps: Services, requested: int | None) -> int:
    max_tokens = requested or deps.settings.default_max_tokens
    if max_tokens > deps.settings.max_tokens_limit:
        raise ApiError(
            400,
            f"max_tokens must be at most {deps.settings.max_tokens_limit}.",
            "invalid_value",
            "max_tokens",
        )
    return max_tokens


def checked_model(deps: Services, model: str | None) -> None:
    if model is not None and model not in deps.settings.models:
        raise ApiError(400, f"Unknown model '{model}'.", "model_not_found", "model")


def error_event(run_id: str, code: str, message: str) -> dict[str, Any]:
    """An SSE `error` event the edge itself raises (no log record behind it, so no cursor)."""
    return {
        "event": "error",
        "data": json.dumps({"run_id": run_id, "code": code, "message": message}),
    }


async def sse_stream(
    deps: Services, run_id: str, replies: AsyncIterator[Reply], live: bool
) -> AsyncIterator[dict[str, Any]]:
    """The chat route's SSE events for a run's replies (live from the hub, or read back from the log)."""
    accepted = time.perf_counter()
    first_token = live
    begun = (
        False  # the run's engine has started it: a `queued` record after that is news of nothing
    )
    STREAMS.inc()
    try:
        async for reply in replies:
            if reply.kind == "queued" and begun:
                continue  # the scheduler sends `queued` beside the run itself: rarely, it lands after the start
            if reply.kind == "delta" and not reply.record["text"]:
                continue  # a keepalive while the prompt is prefilled: it has reset the no-progress timeout
            begun = begun or reply.kind in ("started", "delta")
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
