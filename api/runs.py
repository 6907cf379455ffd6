"""A run's opening at the edge, for a chat message, a regenerate and the OpenAI route: the checks a question
passes before anything is written, the door (shed at once when no pool has room), the run recorded, its prompt
published, the bounded wait for the scheduler's decision (its 429/400 before any byte of a stream), and the
run withdrawn when the log did not take it. Its replies are read by api/streams.py."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from opentelemetry import trace
from prometheus_client import Counter
from sse_starlette.sse import EventSourceResponse

from admission.placement import at_the_door, capacity_message, wanted_pool
from api import convert, streams
from api.auth import Principal
from api.deps import Services
from api.errors import ApiError
from api.replies import (
    ACCEPTED,
    REJECTED,
    TERMINAL,
    Accepted,
    LiveRun,
    NoReplyPartition,
    Reply,
)
from api.settings import ApiSettings
from conversation import tokens
from storage.ids import id_time_ms, new_id
from storage.rows import Chat, ChatBusy
from storage.withdrawals import TAKEN, WITHDRAW_TIMEOUT_S, WITHDRAWN
from topics import records
from topics.events import Generation, Instruction, PromptAccepted, RunRejected
from topics.pipeline import PROMPT_ACCEPTED, RUN_CONTROL

log = logging.getLogger(__name__)
# the longest a run takes from its claim on the chat to its row (else its opening failed)
OPENING_S = 30.0

SLOW_DECISIONS = Counter(
    "parley_edge_slow_admissions_total",
    "Runs kept and streamed before the scheduler decided (past the wait)",
)
SHED = Counter(
    "parley_edge_shed_total",
    "Requests refused at the door: no pool had room for their tier",
    ["tier"],
)


@dataclass(frozen=True)
class Question:
    message_id: str
    content: str
    prev_run_id: (
        str | None
    )  # the chat's answer before it (the scheduler waits until that one is stored)
    instructions: Sequence[Instruction] = ()  # api/preferences.py
    parent_id: str | None = None  # where it goes on the chat's tree (api/branches.py)
    branched: bool = False  # the chat has more than one branch
    memories: bool = False  # recall the person's memories (api/memories.py)
    generation: Generation | None = None  # the servers' tools picked for it (api/tools.py)


def checked_content(settings: ApiSettings, content: str) -> None:
    """A message's text, sent or edited, is at most `max_content_chars` long (checked before anything is written)."""
    limit = settings.max_content_chars
    if len(content) > limit:
        raise ApiError(
            400, f"content is longer than {limit} characters.", "content_too_long", "content"
        )


def checked_max_tokens(settings: ApiSettings, requested: int | None) -> int:
    max_tokens = requested or settings.default_max_tokens
    if max_tokens > settings.max_tokens_limit:
        raise ApiError(
            400,
            f"max_tokens must be at most {settings.max_tokens_limit}.",
            "invalid_value",
            "max_tokens",
        )
    return max_tokens


def reply_partition(deps: Services) -> int:
    """The reply partition a new run's stream is read from: one this replica holds (503 while it holds none)."""
    try:
        return deps.replies.pick()
    except NoReplyPartition as exc:
        raise ApiError(
            503, f"{exc}; retry shortly.", "edge_not_ready", headers={"Retry-After": "1"}
        ) from None


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


async def admitted(
    deps: Services, event: PromptAccepted, replies: AsyncIterator[Reply], stream_refusals: bool
) -> tuple[Reply, AsyncIterator[Reply]]:
    """Wait, bounded, for the scheduler's decision on a run, so that a request over capacity or over budget
    gets its 429 (with Retry-After) before any byte of a stream. Returns the run's first reply record and the
    rest.

    The prompt is in the log already: whatever the scheduler decides later will happen, so a slow decision is
    not refused (a 503 would leave the question stored and answered anyway, and a client retrying it would
    store it twice: docs/decisions/0017-a-prompt-the-edge-gave-up-on.md). Past `admission_timeout_s` the run
    is kept: its first reply is an `accepted` record made here, and the stream goes on with the decision when
    it comes (a refusal then ends the stream as an error event).

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
    if not done or isinstance(first_reply.exception(), streams.StreamTimeout):
        SLOW_DECISIONS.inc()
        wait = deps.settings.admission_timeout_s
        log.warning(
            "run %s: no admission decision in %.0fs; kept, its stream starts now", run_id, wait
        )
        accepted = Accepted(run_id=run_id, chat_id=event["chat_id"], model=event["model"])
        return Reply("", ACCEPTED, accepted), prepend_pending(first_reply, replies)
    first = first_reply.result()
    if first.kind == REJECTED and not (
        stream_refusals and first.rejection["code"] == "content_filter"
    ):
        deps.replies.close(run_id)
        raise rejection_error(first.rejection)
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


def rejection_error(record: RunRejected) -> ApiError:
    """The HTTP error for a run the pipeline refused: 400 for what retrying cannot fix, else 429 with when."""
    code, message = record["code"], record["message"]
    if code == "content_filter":
        return ApiError(400, message, "content_policy_violation")
    if code == "context_length_exceeded":
        return ApiError(400, message, code, "messages")
    if code == "budget_too_small":
        return ApiError(400, message, code, "max_tokens")
    retry_after = record.get("retry_after_s")
    if retry_after:
        return ApiError(429, message, code, headers={"Retry-After": str(retry_after)})
    return ApiError(503, message, code)


async def withdraw(deps: Services, chat: Chat, run_id: uuid.UUID) -> bool:
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
        await deps.conversations.withdraw_run(chat, run_id)
    except Exception:
        log.warning(
            "run %s of chat %s: the log did not take it, nor the store its withdrawal",
            run_id,
            chat.chat_id,
        )
    return True


async def leave_old_place(deps: Services, chat: Chat) -> None:
    """Best effort: a stale activity row left behind is skipped by every list (storage/conversations.py)."""
    try:
        await deps.conversations.leave_old_place(chat)
    except Exception:
        log.warning(
            "chat %s: its old place in the list was not removed (lists skip it)", chat.chat_id
        )


def busy(run_id: str) -> ApiError:
    return ApiError(
        409,
        f"This chat is still answering its previous message (run {run_id}). Wait for that answer, or "
        "cancel it, then send again.",
        "chat_busy",
        headers={"Retry-After": "1", "X-Run-Id": run_id},
    )


async def not_busy(deps: Services, chat: Chat) -> None:
    """409 chat_busy at once when the chat's latest run is still answering: one run of a chat at a time, so a
    second message never waits in the scheduler behind the first (it would hold the chat's partition there).
    The edge streaming a run records its end before its last event (`mark_ended`), so a client's next message,
    sent when it sees that event, finds the run over. A latest run with no row is one being opened (busy) or
    one whose opening failed (free once `OPENING_S` old)."""
    if chat.last_run_id is None:
        return
    run_id = uuid.UUID(chat.last_run_id)
    state = await deps.conversations.get_run(chat.chat_id, run_id)
    if state is None and time.time() * 1000 - id_time_ms(run_id) > OPENING_S * 1000:
        return
    if state is not None and state[1] is not None:
        return
    raise busy(chat.last_run_id)


async def mark_ended(deps: Services, chat_id: uuid.UUID, run_id: uuid.UUID, reason: str) -> None:
    """Best effort, bounded: otherwise the run is over once the persistence stage stores its answer."""
    try:
        await asyncio.wait_for(deps.conversations.end_run(chat_id, run_id, reason), 1.0)
    except Exception:
        log.warning("run %s of chat %s: its end (%s) was not recorded", run_id, chat_id, reason)


async def answer(
    deps: Services,
    user: Principal,
    chat: Chat,
    question: Question,
    max_tokens: int,
    model: str | None,
    run: tuple[str, int] | None = None,
    published: Callable[[], Awaitable[None]] | None = None,
    opening: dict[str, Any] | None = None,
) -> tuple[EventSourceResponse, str]:
    """Publish the question as a new run of the chat and stream its answer: (the SSE response, the run id).
    Raises the run's 429/400 before any byte of the stream when it is shed or refused.

    run: its id and reply partition, when chosen before (an idempotency key's claim names them); published:
    called once the prompt is in the log; opening: the stream's first event (api/redaction.py notice)."""
    message = [{"role": "user", "content": question.content}]
    run_id, partition = run or (str(new_id()), reply_partition(deps))
    may_grow = question.prev_run_id is not None
    shed_when_full(deps, user, run_id, model, message, max_tokens, may_grow=may_grow)
    # Recorded before the prompt goes to the log: a store that does not answer refuses the request with nothing
    # in the log (the other way round, a question refused 503 was stored and answered anyway), and a cancel or
    # a resume finds the run from its first event. A log that does not take the prompt withdraws the run.
    try:
        await deps.conversations.open_run(chat, uuid.UUID(run_id), partition)
    except ChatBusy:
        deps.pools.decided(run_id)
        now_latest = await deps.conversations.get_chat(chat.chat_id)
        raise busy((now_latest or chat).last_run_id or "") from None
    except Exception:
        deps.pools.decided(run_id)  # never reached the log: the door stops counting it
        raise
    # Made after the store's write: its time is when it was published, which a stage reading it much later
    # compares with the producer's delivery timeout (storage/withdrawals.py).
    event = records.prompt_accepted(
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
        instructions=list(question.instructions) or None,
        parent_id=question.parent_id,
        branched=question.branched,
        memories=question.memories,
        generation=question.generation,
        documents=await deps.documents.any_read(chat.chat_id),
    )
    tidy = asyncio.create_task(leave_old_place(deps, chat))  # beside the publish, not before it
    try:
        live = await start_run(deps, event)
        replies = aiter(streams.live(deps, run_id, partition, live))
    except Exception:
        deps.pools.decided(run_id)
        if await asyncio.shield(withdraw(deps, chat, uuid.UUID(run_id))):
            raise
        replies = aiter(
            streams.from_log(deps, partition, run_id, None)
        )  # taken: its replies are in the log
    finally:
        await tidy
    if published is not None:
        await published()
    first, replies = await admitted(deps, event, replies, stream_refusals=True)
    log.info("run %s of chat %s (user %s): %s", run_id, chat.chat_id, user.user_id, first.kind)
    ended = partial(mark_ended, deps, chat.chat_id, uuid.UUID(run_id))
    stream = streams.sse_stream(deps, run_id, prepend(first, replies), True, ended, opening)
    return EventSourceResponse(stream, ping=15, headers={"X-Run-Id": run_id}), run_id


async def request_cancel(
    deps: Services, *, run_id: str, chat_id: str, user_id: str, reason: str
) -> None:
    """Publish RunControl(cancel); the inference consumer holding the run stops it between decode steps."""
    control = convert.run_control(run_id=run_id, chat_id=chat_id, user_id=user_id, reason=reason)
    await deps.producer.publish(RUN_CONTROL, control, key=chat_id)
    log.info("run %s: cancel requested (%s)", run_id, reason)
