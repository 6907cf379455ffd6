"""A chat's messages: list them, post one (its answer streams as SSE), edit or delete one (memory follows),
rate an answer."""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace
from functools import partial
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, Field
from sse_starlette.sse import EventSourceResponse

from api import idempotency, tools
from api.auth import CurrentUser
from api.branches import branches, chosen, listed_branch, parent_for, parent_shown, tree_of
from api.chat_state import forget_message, memory_changed, owned_chat, owned_message
from api.deps import (
    ConversationsDep,
    Deps,
    PoliciesDep,
    PreferencesDep,
    ProducerDep,
    Services,
    SettingsDep,
)
from api.errors import ApiError
from api.idempotency import IdempotencyKey
from api.memories import command, remember
from api.openapi import NEW_RUN
from api.preferences import for_run
from api.redaction import notice, redacted
from api.routes.chats import Limit
from api.runs import (
    Question,
    answer,
    checked_content,
    checked_max_tokens,
    mark_ended,
    not_busy,
    prepend,
    reply_partition,
)
from api.schemas import BranchOut, FeedbackOut, MessageOut, MessagePage
from api.streams import sse_stream
from storage.idempotency import Claim
from storage.ids import decode_cursor, encode_cursor, epoch_ms, new_id, parse_id
from storage.tree import ROOT_ID, leaf
from topics.clock import now_ms
from topics.events import Feedback
from topics.pipeline import FEEDBACK

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/chats")


class MessagePatch(BaseModel):
    content: str = Field(min_length=1)


class NewMessage(BaseModel):
    content: str
    max_tokens: int | None = Field(None, ge=1, strict=True)  # "5" or true is a 400, not coerced
    model: str | None = None
    parent_id: str | None = Field(
        None,
        description="the answer it follows (an earlier one: a new branch, as when a question is edited and "
        "sent again); null: a new first message; left out: the end of the current branch",
    )
    tools: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="tools of registered MCP servers (GET /v1/tools) the answer uses first, then may use again",
    )


class BranchChoice(BaseModel):
    message_id: str = Field(description="a message of the branch to make current")


def cursor_id(cursor: str | None) -> uuid.UUID | None:
    if not cursor:
        return None
    value = decode_cursor(cursor)
    after = parse_id(value.get("after", "")) if value else None
    if after is None:
        raise ApiError(400, "The cursor is not valid.", "invalid_cursor", "cursor")
    return after


@router.get("/{chat_id}/messages")
async def list_messages(
    conversations: ConversationsDep,
    preferences: PreferencesDep,
    user: CurrentUser,
    chat_id: str,
    cursor: str | None = None,
    limit: Limit = 50,
    branch: Annotated[
        str | None,
        Query(description="a message id: the branch through it (default: the current one)"),
    ] = None,
) -> MessagePage:
    """A branch of the chat, root first: each message with its parent and its siblings (the other versions
    of it, itself included), so a client shows "2/3" and opens another with `?branch=` or `PUT .../branch`."""
    parsed, _ = await owned_chat(conversations, user, chat_id)
    path, tree, alive = await listed_branch(conversations, preferences, parsed, branch)
    after = cursor_id(cursor)
    if after is not None:
        path = [m for m in path if uuid.UUID(m.id).time > after.time]
    page, more = path[:limit], len(path) > limit
    return MessagePage(
        data=[
            MessageOut.of(
                m, parent_shown(tree, m.id), [i for i in tree.siblings(m.id) if i in alive]
            )
            for m in page
        ],
        next_cursor=encode_cursor({"after": page[-1].id}) if more else None,
    )


@router.put("/{chat_id}/branch")
async def choose_branch(
    conversations: ConversationsDep,
    preferences: PreferencesDep,
    user: CurrentUser,
    chat_id: str,
    body: BranchChoice,
) -> BranchOut:
    """Make the branch through a message current: the chat lists it, and a new message follows its end."""
    parsed, _ = await owned_chat(conversations, user, chat_id)
    tree = await tree_of(conversations, parsed)
    message_id = chosen(tree, body.message_id, "message_id")
    await preferences.set_branch(parsed, uuid.UUID(message_id))
    return BranchOut(message_id=message_id, leaf_id=leaf(tree.kids, message_id))


@router.post("/{chat_id}/messages", response_class=EventSourceResponse, responses=NEW_RUN)
async def post_message(
    deps: Deps, user: CurrentUser, chat_id: str, body: NewMessage, key: IdempotencyKey = None
) -> EventSourceResponse:
    """Ask; the answer streams. With an Idempotency-Key, a retry gets the first request's run, streamed from
    its start."""
    if not body.content.strip():
        raise ApiError(400, "content must not be empty.", "empty_content", "content")
    checked_content(deps.settings, body.content)
    sent = redacted(deps.policies, deps.settings, user, body.content)  # kept, remembered, published
    content = sent.text.strip()
    max_tokens = checked_max_tokens(deps.settings, body.max_tokens)
    parsed, chat = await owned_chat(deps.conversations, user, chat_id)
    settings = await deps.preferences.chat(parsed)
    run_with = await for_run(deps, user, settings, body.model)
    with_tools = tools.generation(deps.tool_servers, user, body.tools)
    given = "parent_id" in body.model_fields_set
    parent, chosen_before = await parent_for(
        deps.conversations, settings.branch, chat, body.parent_id, given
    )
    branched = settings.branched or branches(chat, parent)
    message_id = new_id()  # sorts before the answer (the run's id)
    run = str(new_id()), reply_partition(deps)
    if key is not None:
        request = idempotency.digest(f"post_message {parsed}", body)
        wanted = Claim(request, str(parsed), run[0], run[1])
        held = await idempotency.claim(deps.idempotency, user, idempotency.checked(key), wanted)
        if held is not None and held.run_id and held.reply_partition is not None:
            return await replayed(deps, parsed, held.run_id, held.reply_partition)
    holder = idempotency.Holder(deps.idempotency, user, key)
    try:
        await not_busy(deps, chat)
        fact = command(content, deps.settings.max_memory_chars) if deps.settings.memories else None
        if fact is not None:  # "remember that …": kept first, so this very answer can recall it
            await remember(
                deps.settings, deps.memories, deps.memory_guard, user, fact, f"chat:{parsed}"
            )
        after = None if parent == ROOT_ID else parent
        # marked before the prompt goes: its context is read along the tree
        if branched and not settings.branched:
            await deps.preferences.mark_branched(parsed)
        recall = run_with.memories or (fact is not None and run_with.memories_on)
        question = Question(
            str(message_id),
            sent.text,
            after,
            run_with.instructions,
            parent,
            branched,
            recall,
            with_tools,
        )
        first = notice(run[0], str(message_id), sent) if sent.changed else None
        response, _ = await answer(
            deps, user, chat, question, max_tokens, run_with.model, run, holder.made, first
        )
        if chosen_before:  # the new message's branch is the current one now
            await deps.preferences.set_branch(parsed, None)
    except BaseException as exc:
        await holder.failed(exc)
        raise
    return response


async def replayed(
    deps: Services, chat_id: uuid.UUID, run_id: str, partition: int
) -> EventSourceResponse:
    """The run an earlier request with the same Idempotency-Key opened, streamed from the log from its start."""
    first, rest = await idempotency.first_replies(deps, run_id, partition, stream_refusals=True)
    ended = partial(mark_ended, deps, chat_id, uuid.UUID(run_id))
    stream = sse_stream(deps, run_id, prepend(first, rest), live=False, ended=ended)
    return EventSourceResponse(stream, ping=15, headers={"X-Run-Id": run_id})


@router.patch("/{chat_id}/messages/{message_id}")
async def edit_message(
    conversations: ConversationsDep,
    producer: ProducerDep,
    settings: SettingsDep,
    policies: PoliciesDep,
    user: CurrentUser,
    chat_id: str,
    message_id: str,
    body: MessagePatch,
) -> MessageOut:
    """Change a message's text. Memory follows: the next prompt carries neither its old embedding nor a summary
    covering it (conversation/gather.py), and the memory stage embeds the new text and summarises again."""
    if not body.content.strip():
        raise ApiError(400, "content must not be empty.", "empty_content", "content")
    checked_content(settings, body.content)
    content = redacted(policies, settings, user, body.content, "edit").text
    parsed, _ = await owned_chat(conversations, user, chat_id)
    message = await owned_message(conversations, settings, parsed, message_id)
    at = epoch_ms(
        await conversations.edit_message(parsed, uuid.UUID(message.id), content, user.user_id)
    )
    fields = {"message_id": message.id, "role": message.role, "content": content}
    await memory_changed(producer, parsed, user.user_id, "edited", at, **fields)
    log.info("chat %s: message %s edited by %s", chat_id, message.id, user.user_id)
    return MessageOut.of(replace(message, content=content))


@router.delete("/{chat_id}/messages/{message_id}", status_code=204)
async def delete_message(
    conversations: ConversationsDep,
    producer: ProducerDep,
    settings: SettingsDep,
    user: CurrentUser,
    chat_id: str,
    message_id: str,
) -> Response:
    """Delete a message, with its embedding and every summary that covers it."""
    parsed, _ = await owned_chat(conversations, user, chat_id)
    message = await owned_message(conversations, settings, parsed, message_id)
    await forget_message(conversations, producer, parsed, user, message)
    log.info("chat %s: message %s deleted by %s", chat_id, message.id, user.user_id)
    return Response(status_code=204)


class NewFeedback(BaseModel):
    rating: Literal["up", "down"] | None = Field(description="null takes a rating back")
    comment: str | None = Field(None, max_length=2000)


@router.post("/{chat_id}/messages/{message_id}/feedback", status_code=202)
async def feedback(
    conversations: ConversationsDep,
    producer: ProducerDep,
    settings: SettingsDep,
    user: CurrentUser,
    chat_id: str,
    message_id: str,
    body: NewFeedback,
) -> FeedbackOut:
    """Thumbs up or down on an answer: a Feedback event (kept in the log for evals); the persistence stage shows
    it on the stored answer."""
    parsed, _ = await owned_chat(conversations, user, chat_id)
    message = await owned_message(conversations, settings, parsed, message_id)
    if message.role != "assistant":
        raise ApiError(400, "Only an answer can be rated.", "invalid_value", "message_id")
    event: Feedback = {
        "event_id": str(uuid.uuid4()),
        "chat_id": str(parsed),
        "user_id": user.user_id,
        "message_id": message.id,
        "rating": body.rating or "none",
        "comment": body.comment,
        "model": message.model,
        "at": now_ms(),
    }
    await producer.publish(FEEDBACK, event, key=str(parsed))
    log.info(
        "chat %s: answer %s rated %s by %s", chat_id, message.id, event["rating"], user.user_id
    )
    return FeedbackOut(id=message.id, rating=body.rating)
