"""A chat's runs: replay a run's stream from any replica (after Last-Event-ID), cancel it, regenerate it."""

from __future__ import annotations

import logging
import uuid
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Header
from pydantic import BaseModel, Field
from sse_starlette.sse import EventSourceResponse

from api import runs, streams
from api.auth import CurrentUser
from api.chat_state import forget_message, owned_run
from api.deps import Deps
from api.errors import ApiError
from api.openapi import NEW_RUN, STREAM
from api.preferences import for_run
from api.replies import parse_cursor
from api.runs import Question, answer, checked_max_tokens
from api.schemas import Cancelling
from api.streams import sse_stream

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/chats")


@router.get("/{chat_id}/runs/{run_id}/events", response_class=EventSourceResponse, responses=STREAM)
async def run_events(
    deps: Deps,
    user: CurrentUser,
    chat_id: str,
    run_id: str,
    last_event_id: Annotated[str | None, Header()] = None,
) -> EventSourceResponse:
    """Replay a run's stream from the log: whole, or after the Last-Event-ID cursor; live until it ends.

    Works on any edge replica, after an edge restart, and from several devices at once (a person holds at most
    `max_streams_per_person` of these open on one replica: 429 `too_many_streams` after).
    """
    chat, partition, finish = await owned_run(deps.conversations, user, chat_id, run_id)
    after = None
    if last_event_id is not None:
        after = parse_cursor(last_event_id.strip())
        if after is None or after[1] != partition:
            raise ApiError(
                400, "Last-Event-ID is not a cursor of this run's stream.", "invalid_last_event_id"
            )
    parsed = uuid.UUID(run_id)
    release = streams.claim(deps.settings, user.user_id)
    replies = streams.from_log(deps, partition, str(parsed), after)
    ended = partial(runs.mark_ended, deps, chat.chat_id, parsed) if finish is None else None
    stream = sse_stream(deps, run_id, replies, live=False, ended=ended)
    return EventSourceResponse(streams.held(stream, release), ping=15)


@router.post("/{chat_id}/runs/{run_id}/cancel", status_code=202)
async def cancel_run(deps: Deps, user: CurrentUser, chat_id: str, run_id: str) -> Cancelling:
    """Stop a run between decode steps; it completes with finish_reason "cancelled", its partial answer stored."""
    chat, _, finish_reason = await owned_run(deps.conversations, user, chat_id, run_id)
    if finish_reason is not None:
        raise ApiError(409, f"The run already finished ({finish_reason}).", "run_already_finished")
    await runs.request_cancel(
        deps,
        run_id=str(uuid.UUID(run_id)),
        chat_id=str(chat.chat_id),
        user_id=user.user_id,
        reason="user",
    )
    return Cancelling(id=run_id)


class Regenerate(BaseModel):
    max_tokens: int | None = Field(None, ge=1, strict=True)
    model: str | None = None


@router.post(
    "/{chat_id}/runs/{run_id}/regenerate", response_class=EventSourceResponse, responses=NEW_RUN
)
async def regenerate(
    deps: Deps, user: CurrentUser, chat_id: str, run_id: str, body: Regenerate | None = None
) -> EventSourceResponse:
    """Answer the chat's latest question again, as a new run streamed like a new message. Only the latest run,
    once it has ended. The question keeps its place (same message id, so the scheduler's context is what the
    first answer saw); the old answer is deleted, with its memory, once the new run is admitted."""
    body = body or Regenerate()
    max_tokens = checked_max_tokens(deps.settings, body.max_tokens)
    chat, _, finish_reason = await owned_run(deps.conversations, user, chat_id, run_id)
    model, instructions = await for_run(deps, user, chat.chat_id, body.model)
    parsed = chat.chat_id
    old = str(uuid.UUID(run_id))
    if chat.last_run_id != old:
        raise ApiError(409, "Only the chat's latest answer can be regenerated.", "not_latest_run")
    if finish_reason is None:
        raise ApiError(409, "The run is still answering; stop it first.", "run_in_progress")
    recent = await deps.conversations.messages_after(parsed, None, 4)  # the newest, oldest first
    asked = [i for i, m in enumerate(recent) if m.role == "user" and m.run_id == old]
    if not asked:
        raise ApiError(
            409, "The question of this answer is no longer stored.", "question_not_found"
        )
    at = asked[-1]
    earlier = recent[at - 1].id if at > 0 else None
    question = Question(recent[at].id, recent[at].content, earlier, instructions)
    response, new_run = await answer(deps, user, chat, question, max_tokens, model)
    previous = next((m for m in recent if m.id == old), None)
    if previous is not None:
        await forget_message(deps.conversations, deps.producer, parsed, user, previous)
    log.info("chat %s: run %s regenerated as %s by %s", chat_id, old, new_run, user.user_id)
    return response
