"""A run's reply records as an async iterator, live from this replica's hub or read back from the log, and the
chat route's SSE events made of them.

Both routes that stream (the chat route's SSE events and the OpenAI route's chunks) map these Replies to
their own wire format. A run that makes no progress ends with StreamTimeout, never hangs.
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

from confluent_kafka import KafkaException
from prometheus_client import Counter, Gauge, Histogram

from api import convert
from api.deps import Services
from api.errors import ApiError
from api.replies import (
    HANDOFF,
    REJECTED,
    TERMINAL,
    LiveRun,
    Replay,
    Reply,
    parse_cursor,
)
from api.settings import ApiSettings
from runtime.kafka import until_ready
from storage.ids import id_time_ms
from topics.events import TokenDelta

log = logging.getLogger(__name__)

EDGE_TTFT = Histogram(
    "parley_edge_ttft_seconds",
    "Accept to first token at the edge",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
)
STREAMS = Gauge("parley_edge_open_streams", "SSE streams open on this replica")
RUNS = Counter("parley_edge_runs_total", "Runs opened on this replica", ["outcome"])

# clock skew between the edge that minted the run id and the producers' timestamps
REPLAY_MARGIN_MS = 5_000


class StreamTimeout(Exception):
    pass


class ForeignCursor(Exception):
    """The Last-Event-ID points at a record of another run."""


def since_ms(run_id: str) -> int:
    """Where in the log (by time) a run's records can start: its time-ordered id's timestamp, less a margin."""
    return id_time_ms(uuid.UUID(run_id)) - REPLAY_MARGIN_MS


async def live(deps: Services, run_id: str, partition: int, run: LiveRun) -> AsyncIterator[Reply]:
    """The run's records as the hub hands them over; after an overflow, the rest from the log."""
    timeout = deps.settings.first_event_timeout_s
    last: str | None = None
    while True:
        if run.overflowed and run.queue.empty():
            after = parse_cursor(last) if last else None
            async for reply in from_log(deps, partition, run_id, after):
                yield reply
            return
        if not run.queue.empty():
            reply = run.queue.get_nowait()  # the common case under load: no timer task per record
        else:
            try:
                reply = await asyncio.wait_for(run.queue.get(), timeout)
            except TimeoutError:
                raise StreamTimeout(f"No progress on this run for {timeout:.0f}s.") from None
        if reply.kind == HANDOFF:
            continue  # this replica no longer reads the run's partition: the rest comes from the log
        timeout = deps.settings.stream_idle_timeout_s
        last = reply.cursor
        yield reply
        if reply.kind in TERMINAL:
            return


async def from_log(
    deps: Services, partition: int, run_id: str, after: tuple[str, int, int] | None
) -> AsyncIterator[Reply]:
    """The run's records read straight from its reply partition: whole, or after a cursor; live until it ends."""
    if after is not None and after[0] == "r":
        return  # the client already has the run's terminal record (a rejection)
    loop = asyncio.get_running_loop()
    settings = deps.settings
    reader = Replay(settings.kafka_bootstrap, settings.namespace, partition, run_id)
    try:
        seek = partial(reader.seek, since_ms(run_id), after)
        try:  # the partition's leader may be moving (a broker died): ask again until it answers
            what = f"run {run_id}: seek on reply partition {partition}"
            await loop.run_in_executor(
                None, until_ready, what, seek, settings.first_event_timeout_s
            )
        except KafkaException:
            raise StreamTimeout("The log did not answer where this run's records are.") from None
        deadline = loop.time() + settings.first_event_timeout_s
        while True:
            try:
                reply = await loop.run_in_executor(None, reader.poll, 0.5)
            except ValueError as exc:
                raise ForeignCursor(str(exc)) from None
            if reader.finished:
                return
            if reply is None:
                if loop.time() > deadline:
                    raise StreamTimeout("No progress on this run.")
                continue
            deadline = loop.time() + settings.stream_idle_timeout_s
            yield reply
            if reply.kind in TERMINAL:
                return
    finally:
        await loop.run_in_executor(None, reader.close)


def error_event(run_id: str, code: str, message: str) -> dict[str, Any]:
    """An SSE `error` event the edge itself raises (no log record behind it, so no cursor)."""
    return {
        "event": "error",
        "data": json.dumps({"run_id": run_id, "code": code, "message": message}),
    }


def finish_reason(reply: Reply) -> str:
    """How a run ended, from its terminal record: as its stored answer will say."""
    if reply.kind == REJECTED:
        return str(reply.rejection["code"])
    return str(reply.delta.get("finish_reason") or "error")


# Resume streams each person holds open on this replica (api/routes/chat_runs.py): new runs are bounded per person
# by the admission limits (max_concurrent) and one run per chat; replays are not, so they are capped here.
_open: dict[str, int] = {}


def claim(settings: ApiSettings, user_id: str) -> Callable[[], None]:
    """Hold one of the person's streams on this replica (429 over the cap); the release, to call once."""
    if _open.get(user_id, 0) >= settings.max_streams_per_person:
        raise ApiError(
            429,
            f"You have {settings.max_streams_per_person} streams open on this server; close one and retry.",
            "too_many_streams",
            headers={"Retry-After": "5"},
        )
    _open[user_id] = _open.get(user_id, 0) + 1
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            _open[user_id] -= 1
            if not _open[user_id]:
                del _open[user_id]

    return release


async def held(
    stream: AsyncIterator[dict[str, Any]], release: Callable[[], None]
) -> AsyncIterator[dict[str, Any]]:
    """The stream, releasing its hold when it ends, however it ends."""
    try:
        async for event in stream:
            yield event
    finally:
        release()


def kept(record: TokenDelta) -> bool:
    """A delta record with something in it: text, or a run's tool calls or a tool's result (not a keepalive)."""
    return bool(record["text"] or record.get("tool_calls") or record.get("tool_result"))


async def sse_stream(
    deps: Services,
    run_id: str,
    replies: AsyncIterator[Reply],
    live: bool,
    ended: Callable[[str], Awaitable[None]] | None = None,
    opening: dict[str, Any] | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """The chat route's SSE events for a run's replies (live from the hub, or read back from the log).

    ended: told how the run ended before its last event is sent (so a client's next request, made when it sees
    that event, finds the run over); opening: the edge's own first event (api/redaction.py notice)."""
    accepted = time.perf_counter()
    first_token = live
    # The scheduler sends `queued` beside the run itself: rarely it lands after the run's start, and is shown
    # then (it names the pool and any degradation); a second one (read again after a resume) is not.
    told_queued = False
    STREAMS.inc()
    try:
        if opening is not None:
            yield opening
        async for reply in replies:
            if reply.kind == "queued" and told_queued:
                continue
            told_queued = told_queued or reply.kind == "queued"
            if reply.kind == "delta" and not kept(reply.delta):
                continue  # a keepalive while the prompt is prefilled: it has reset the no-progress timeout
            if reply.kind == "delta" and first_token:
                EDGE_TTFT.observe(time.perf_counter() - accepted)
                first_token = False
            if reply.kind in TERMINAL and ended is not None:
                await ended(finish_reason(reply))
            yield convert.sse(reply)
            if reply.kind in TERMINAL and live:
                RUNS.labels(reply.kind).inc()
    except StreamTimeout as exc:
        RUNS.labels("timeout").inc()
        yield error_event(run_id, "timeout", str(exc))
    except ForeignCursor:
        yield error_event(run_id, "invalid_last_event_id", "The cursor is not of this run.")
    finally:
        STREAMS.dec()
        if live:
            deps.replies.close(run_id)
