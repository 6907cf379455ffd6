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
from api.branches import tree_of
from api.chat_state import owned_run
from api.deps import Deps
from api.errors import ApiError
from api.openapi import NEW_RUN, STREAM
from api.preferences import for_run
from api.replies import parse_cursor
from api.runs import Question, answer, checked_max_tokens, not_busy
from api.schemas import Cancelling
from api.streams import sse_stream
from storage.tree import ROOT_ID

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
    """Answer an answer's question again, as a new run streamed like a new message: the new answer is a sibling
    of the old one, which stays (the chat's branch moves to the new one; `?branch=` or `PUT .../branch` goes
    back). Only the last answer of a branch, once its run has ended and while no other run of the chat is
    answering. The question keeps its place (same message id), so the context is the one the first answer
    saw."""
    body = body or Regenerate()
    max_tokens = checked_max_tokens(deps.settings, body.max_tokens)
    chat, _, finish_reason = await owned_run(deps.conversations, user, chat_id, run_id)
    settings = await deps.preferences.chat(chat.chat_id)
    run_with = await for_run(deps, user, settings, body.model)
    if finish_reason is None:
        raise ApiError(409, "The run is still answering; stop it first.", "run_in_progress")
    await not_busy(deps, chat)
    tree = await tree_of(deps.conversations, chat.chat_id)
    old = str(uuid.UUID(run_id))
    if tree.kids.get(old):
        raise ApiError(
            409,
            "Only the last answer of a branch can be regenerated; to branch from an earlier question, edit it "
            "and send it again.",
            "not_latest_run",
        )
    asked = tree.parent_of.get(old, ROOT_ID)
    question = None
    if asked != ROOT_ID:
        question = await deps.conversations.get_message(chat.chat_id, uuid.UUID(asked))
    if question is None or question.role != "user":
        raise ApiError(
            409, "The question of this answer is no longer stored.", "question_not_found"
        )
    parent = tree.parent_of[question.id]
    earlier = None if parent == ROOT_ID else parent
    if not settings.branched:  # the new answer is a sibling: the chat has branches from now on
        await deps.preferences.mark_branched(chat.chat_id)
    again = Question(
        question.id,
        question.content,
        earlier,
        run_with.instructions,
        parent,
        True,
        run_with.memories,
    )
    response, new_run = await answer(deps, user, chat, again, max_tokens, run_with.model)
    if settings.branch is not None:
        await deps.preferences.set_branch(chat.chat_id, None)
    log.info("chat %s: run %s regenerated as %s by %s", chat_id, run_id, new_run, user.user_id)
    return response
