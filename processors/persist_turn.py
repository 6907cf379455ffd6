"""PromptAccepted | RunCompleted | RunRejected -> Cassandra messages (idempotent: keyed by the event's ids).
PromptModerated | OutputModerated that matched a rule -> the safety decisions admins review.
Feedback -> the rating shown on the stored answer.
MemoryChanged of a deleted chat -> its messages erased (this stage is the one writer of the messages table;
a user's edits and deletes are the edge's, kept beside them: storage/conversations.py).

Runs of the stateless OpenAI route (store = false) are not written as messages; they are metered and stay
in the log. A deleted chat gets no new rows from runs that were still in flight when it was deleted.
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from processors.settings import ProcessorSettings
from processors.stage import Handler, Stage, on
from storage import schema
from storage.conversations import ERASE_WAIT_S, Conversations
from storage.decisions import SafetyDecision, SafetyDecisions
from storage.rows import Message
from storage.withdrawals import WITHDRAWN, ids, suspect
from topics.clock import now_ms
from topics.events import (
    Feedback,
    MemoryChanged,
    OutputModerated,
    PromptAccepted,
    PromptModerated,
    RunCompleted,
    RunRejected,
)
from topics.pipeline import (
    FEEDBACK,
    MEMORY_CHANGED,
    OUTPUT_MODERATED,
    PROMPT_ACCEPTED,
    PROMPT_MODERATED,
    RUN_COMPLETED,
    RUN_REJECTED,
)

EXCERPT_CHARS = 300


def _at(ms: int) -> datetime:
    """An event's epoch-ms timestamp as the Cassandra column's datetime."""
    return datetime.fromtimestamp(ms / 1000, UTC)


def user_turn(prompt: PromptAccepted) -> Message:
    return Message(
        prompt["message_id"],
        "user",
        prompt["content"],
        _at(prompt["created_at"]),
        prompt["run_id"],
        parent_id=prompt.get("parent_id"),
    )


def answers(prompt: PromptAccepted) -> str | None:
    """An answer's parent on the chat's tree: its question (None for a record written before the tree)."""
    return prompt["message_id"] if prompt.get("parent_id") else None


def assistant_turn(done: RunCompleted) -> Message:
    return Message(
        done["prompt"]["run_id"],
        "assistant",
        done["content"],
        _at(done["completed_at"]),
        done["prompt"]["run_id"],
        done["model"],
        done["finish_reason"],
        done["pool"],
        parent_id=answers(done["prompt"]),
        memories=tuple(done.get("memories") or ()),
        sources=tuple(dict(s) for s in done.get("sources") or ()),
        tools=tuple(dict(u) for u in done.get("tools") or ()),
    )


def refusal_turn(rejected: RunRejected) -> Message:
    return Message(
        rejected["prompt"]["run_id"],
        "assistant",
        rejected["message"],
        _at(rejected["rejected_at"]),
        rejected["prompt"]["run_id"],
        None,
        rejected["code"],
        parent_id=answers(rejected["prompt"]),
    )


def review_row(
    moderated: PromptModerated | OutputModerated,
    stage: str,
    action: str,
    run: PromptAccepted | OutputModerated,
    score: float | None,
    excerpt: str,
) -> SafetyDecision:
    """The review row of a moderation event; run: what names the run (a PromptAccepted, or the
    OutputModerated event itself, both with run_id, chat_id, user_id and tier)."""
    return SafetyDecision(
        uuid.UUID(moderated["event_id"]),
        _at(moderated["moderated_at"]),
        stage,
        action,
        moderated["category"] or "unknown",
        score,
        moderated["policy_version"],
        run["run_id"],
        run["chat_id"],
        run["user_id"],
        run["tier"],
        excerpt,
    )


def input_decision(moderated: PromptModerated) -> SafetyDecision | None:
    """The review row of a prompt's moderation, when a rule matched (pure)."""
    if not (action := moderated.get("action")):
        return None
    prompt, category = moderated["prompt"], moderated["category"]
    score = (moderated.get("scores") or {}).get(category) if category else None
    return review_row(moderated, "input", action, prompt, score, prompt["content"][:EXCERPT_CHARS])


def output_decision(moderated: OutputModerated) -> SafetyDecision | None:
    """The review row of an answer's moderation, when a rule matched (pure): the excerpt is not kept (the
    retracted text stays only in the reply log), the score is the highest any window got in the category."""
    if not (action := moderated.get("action")):
        return None
    category = moderated["category"]
    scores = [
        w["scores"][category] for w in moderated["windows"] if category and category in w["scores"]
    ]
    at = moderated["retracted_from"]
    excerpt = f"retracted from character {at}" if at is not None else ""
    return review_row(
        moderated, "output", action, moderated, max(scores) if scores else None, excerpt
    )


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Deps:
    conversations: Conversations
    decisions: SafetyDecisions
    decisions_days: int = (
        90  # how far back an erased person's decisions are looked for: their period
    )


# A period of 0 (kept until deleted) looks back this many days for an erased person's decisions.
MAX_DECISION_DAYS = 3 * 366


async def stored_chat(prompt: PromptAccepted, deps: Deps) -> uuid.UUID | None:
    """The chat to write into, or None for a stateless run or a chat deleted meanwhile."""
    if not prompt.get("store", True):
        return None
    chat_id = uuid.UUID(prompt["chat_id"])
    if await deps.conversations.get_chat(chat_id) is None:
        log.info("chat %s was deleted; not storing run %s", chat_id, prompt["run_id"])
        return None
    return chat_id


async def store(prompt: PromptAccepted, message: Message, deps: Deps) -> None:
    """Write a turn of a chat that still exists, then look again: a chat deleted meanwhile may have had its
    messages erased before this write (MEMORY_CHANGED is another topic, handled beside this one), so its
    messages are erased once more and nothing of it outlives the delete."""
    if chat_id := await stored_chat(prompt, deps):
        await deps.conversations.put_message(chat_id, message, prompt["user_id"])
        if await deps.conversations.deleted(chat_id):
            await deps.conversations.erase_messages(chat_id)
            log.info(
                "chat %s was deleted while run %s was stored; erased again",
                chat_id,
                prompt["run_id"],
            )


async def forget_question(prompt: PromptAccepted, deps: Deps) -> None:
    await deps.conversations.unput_message(
        uuid.UUID(prompt["chat_id"]), uuid.UUID(prompt["message_id"])
    )


async def on_prompt(prompt: PromptAccepted, deps: Deps) -> None:
    await store(prompt, user_turn(prompt), deps)
    # A question the edge refused after the log did not acknowledge it is not kept (storage/withdrawals.py):
    # looked at after the write, so a withdrawal settled before it or after it (the scheduler's RunRejected
    # `withdrawn`, on_rejected) removes it either way.
    if suspect(prompt, now_ms()) and await deps.conversations.fate(*ids(prompt)) == WITHDRAWN:
        await forget_question(prompt, deps)


async def on_completed(done: RunCompleted, deps: Deps) -> None:
    await store(done["prompt"], assistant_turn(done), deps)  # how the run ended, too


async def on_rejected(rejected: RunRejected, deps: Deps) -> None:
    prompt = rejected["prompt"]
    if (
        rejected["code"] == WITHDRAWN
    ):  # the edge answered 503: neither the question nor an answer is kept
        await forget_question(prompt, deps)
        log.info("run %s was withdrawn by the edge: its question removed", prompt["run_id"])
        return
    await store(prompt, refusal_turn(rejected), deps)


async def on_moderated(moderated: PromptModerated, deps: Deps) -> None:
    if decision := input_decision(moderated):
        await deps.decisions.put(decision)


async def on_output_moderated(moderated: OutputModerated, deps: Deps) -> None:
    if decision := output_decision(moderated):
        await deps.decisions.put(decision)


async def on_feedback(feedback: Feedback, deps: Deps) -> None:
    """The latest rating wins (events of one chat arrive in order); a rating of a deleted answer is dropped."""
    rating = None if feedback["rating"] == "none" else feedback["rating"]
    chat_id, message_id = uuid.UUID(feedback["chat_id"]), uuid.UUID(feedback["message_id"])
    if not await deps.conversations.set_feedback(chat_id, message_id, rating):
        log.info("chat %s: feedback on message %s, which is gone; not stored", chat_id, message_id)


async def on_changed(change: MemoryChanged, deps: Deps) -> None:
    """A deleted chat's messages go (the edge has deleted the chat, its runs and its changes); an erased person's
    safety decisions go (their chats were deleted, each by its own event, before)."""
    if change["action"] == "person_erased":
        gone = await deps.decisions.forget_person(change["user_id"], deps.decisions_days)
        log.info("person %s erased: %d safety decisions deleted", change["user_id"], gone)
    elif change["action"] == "chat_deleted":
        chat_id = uuid.UUID(change["chat_id"])
        # once the edge has deleted the row (it tells first): a turn written after that erases itself
        gone = await deps.conversations.deleted(chat_id, ERASE_WAIT_S)
        await deps.conversations.erase_messages(chat_id)
        log.info(
            "chat %s deleted: its messages erased%s",
            chat_id,
            "" if gone else " (its row is still there)",
        )


HANDLERS: list[Handler[Deps]] = [
    on(PROMPT_MODERATED, on_moderated),
    on(MEMORY_CHANGED, on_changed),
    on(FEEDBACK, on_feedback),
    on(OUTPUT_MODERATED, on_output_moderated),
    on(PROMPT_ACCEPTED, on_prompt),
    on(RUN_COMPLETED, on_completed),
    on(RUN_REJECTED, on_rejected),
]


def build(stage: Stage, settings: ProcessorSettings) -> None:
    session = schema.connect(settings.cassandra)
    keyspace = settings.keyspace_name
    deps = Deps(
        Conversations(session, keyspace, stage.name),
        SafetyDecisions(session, keyspace, stage.name),
        math.ceil(settings.retain_safety_days) or MAX_DECISION_DAYS,
    )
    stage.serve(HANDLERS, deps)
