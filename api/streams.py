"""A run's reply records as an async iterator, live from this replica's hub or read back from the log.

Both routes that stream (the chat route's SSE events and the OpenAI route's chunks) map these Replies to
their own wire format. A run that makes no progress ends with StreamTimeout, never hangs.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from functools import partial
from typing import Any

from confluent_kafka import KafkaException
from opentelemetry import trace
from prometheus_client import Counter

from admission.placement import at_the_door, capacity_message, wanted_pool
from api import convert
from api.auth import Principal
from api.deps import Services
from api.errors import ApiError
from api.replies import (
    ACCEPTED,
    HANDOFF,
    TERMINAL,
    LiveRun,
    NoReplyPartition,
    Replay,
    Reply,
    parse_cursor,
)
from conversation import tokens
from runtime.kafka import until_ready
from storage.ids import id_time_ms
from topics.codec import Event
from topics.events import PromptAccepted
from topics.pipeline import PROMPT_ACCEPTED, RUN_CONTROL

log = logging.getLogger(__name__)

REPLAY_MARGIN_MS = (
    5_000  # clock skew between the edge that minted the run id and the producers' timestamps
)


SLOW_DECISIONS = Counter(
    "parley_edge_slow_admissions_total",
    "Runs kept and streamed before the scheduler decided (past the wait)",
)
SHED = Counter(
    "parley_edge_shed_total",
    "Requests refused at the door: no pool had room for their tier",
    ["tier"],
)


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


def rejection_error(record: Event) -> ApiError:
    """The HTTP error for a run the pipeline refused: 400 for what retrying cannot fix, else 429 with when."""
    code, message = record["code"], record["message"]
    if code == "content_filter":
        return ApiError(400, message, "content_policy_violation")
    if code == "context_length_exceeded":
        return ApiError(400, message, code, "messages")
    if code == "budget_too_small":
        return ApiError(400, message, code, "max_tokens")
    if record["retry_after_s"]:
        return ApiError(429, message, code, headers={"Retry-After": str(record["retry_after_s"])})
    return ApiError(503, message, code)


def shed_when_full(
    deps: Services,
    user: Principal,
    run_id: str,
    model: str | None,
    messages: Sequence[Mapping[str, Any]],
    max_tokens: int,
    may_grow: bool,
) -> None:
    """429 over_capacity now, before the request enters the pipeline, when no pool it could be placed in has
    room for the user's tier (admission.placement.at_the_door); otherwise the scheduler decides. The request's
    size is the one every stage uses: the serving model's tokenizer and chat template (conversation/tokens.py),
    here over the messages the request brings (the least of the pools' counts: a lower bound of what the
    scheduler will count with the history added)."""
    settings = deps.settings
    tokenizers = {
        pool.tokenizer for pool in settings.pools.values()
    }  # pools serving one model share one
    least = min(tokens.load(spec).count_chat(messages) for spec in tokenizers)
    placement = at_the_door(
        model,
        least + max_tokens,
        may_grow,
        settings.pools,
        settings.default_pool,
        deps.pools.loads(),
        user.tier,
        deps.limits.tiers_for(user.user_id, user.tier),
    )
    if placement is None:
        # Let through: it waits in the pool it asks for until the scheduler's decision reaches `admitted`.
        deps.pools.pending(
            run_id, wanted_pool(model, settings.pools, settings.default_pool), user.tier
        )
        return
    SHED.labels(user.tier).inc()
    log.info(
        "shed a request of %s (%s) at the door: about %.1fs of queue",
        user.user_id,
        user.tier,
        placement.wait_s,
    )
    raise ApiError(
        429,
        capacity_message(model or settings.models[0], placement.wait_s),
        "over_capacity",
        headers={"Retry-After": str(placement.retry_after_s)},
    )


async def admitted(
    deps: Services, event: Event, replies: AsyncIterator[Reply], stream_refusals: bool
) -> tuple[Reply, AsyncIterator[Reply]]:
    """Wait, bounded, for the scheduler's decision on a run, so that a request over capacity or over budget
    gets its 429 (with Retry-After) before any byte of a stream. Returns the run's first reply record and the
    rest.

    The prompt is in the log already: whatever the scheduler decides later will happen, so a slow decision is
    not refused (a 503 here used to leave the question stored and answered "cancelled", and a client retrying
    it stored it twice). Past `admission_timeout_s` the run is kept: its first reply is an `accepted` record
    made here, and the stream goes on with the decision when it comes (a refusal then ends the stream as an
    error event).

    stream_refusals: a content-policy refusal is the chat's own answer (a `moderation` event), not an error.
    """
    run_id = event["run_id"]
    first_reply = asyncio.ensure_future(anext(replies))
    try:
        done, _ = await asyncio.wait({first_reply}, timeout=deps.settings.admission_timeout_s)
    except asyncio.CancelledError:
        first_reply.cancel()
        raise
    finally:
        deps.pools.decided(
            run_id
        )  # the door counts it no longer: a placement or a refusal says the rest
    # No record at all (the log did not answer) is no decision either: the stream says so as its error event.
    if not done or isinstance(first_reply.exception(), StreamTimeout):
        SLOW_DECISIONS.inc()
        wait = deps.settings.admission_timeout_s
        log.warning(
            "run %s: no admission decision in %.0fs; kept, its stream starts now", run_id, wait
        )
        accepted = {"run_id": run_id, "chat_id": event["chat_id"], "model": event["model"]}
        return Reply("", ACCEPTED, accepted), prepend_pending(first_reply, replies)
    first = first_reply.result()
    if first.kind == "rejected" and not (
        stream_refusals and first.record["code"] == "content_filter"
    ):
        deps.replies.close(run_id)
        raise rejection_error(first.record)
    return first, replies


async def prepend_pending(
    first: asyncio.Future[Reply], rest: AsyncIterator[Reply]
) -> AsyncIterator[Reply]:
    """The replies of a run whose first record is still on its way, then the rest."""
    try:
        reply = await first
    finally:
        first.cancel()  # the stream ended before it came (the client went away)
    async for later in prepend(reply, rest):
        yield later


async def prepend(first: Reply, rest: AsyncIterator[Reply]) -> AsyncIterator[Reply]:
    yield first
    if first.kind in TERMINAL:
        return
    async for reply in rest:
        yield reply


def reply_partition(deps: Services) -> int:
    """The reply partition a new run's stream is read from: one this replica holds (503 while it holds none)."""
    try:
        return deps.replies.pick()
    except NoReplyPartition as exc:
        raise ApiError(
            503, f"{exc}; retry shortly.", "edge_not_ready", headers={"Retry-After": "1"}
        ) from None


async def start_run(deps: Services, event: PromptAccepted) -> LiveRun:
    """Publish an accepted prompt, registered with the hub first so none of its replies can be missed."""
    run = deps.replies.open(event["run_id"], event["reply_partition"])
    tracer = trace.get_tracer("parley-api")
    try:
        with tracer.start_as_current_span("accept prompt", kind=trace.SpanKind.PRODUCER) as span:
            span.set_attribute("parley.run_id", event["run_id"])
            await deps.producer.publish(PROMPT_ACCEPTED, event, key=event["chat_id"])
    except Exception:
        deps.replies.close(event["run_id"])
        raise
    return run


async def request_cancel(
    deps: Services, *, run_id: str, chat_id: str, user_id: str, reason: str
) -> None:
    """Publish RunControl(cancel); the inference consumer holding the run stops it between decode steps."""
    control = convert.run_control(run_id=run_id, chat_id=chat_id, user_id=user_id, reason=reason)
    await deps.producer.publish(RUN_CONTROL, control, key=chat_id)
    log.info("run %s: cancel requested (%s)", run_id, reason)
