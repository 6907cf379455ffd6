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
import time
import uuid
from datetime import UTC, datetime

from processors.stage import Stage
from storage.conversations import ERASE_WAIT_S, Conversations, Message
from storage.decisions import SafetyDecision, SafetyDecisions
from storage.withdrawals import WITHDRAWN, ids, suspect
from topics.codec import Event
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


def user_turn(prompt: Event) -> Message:
    return Message(prompt["message_id"], "user", prompt["content"], _at(prompt["created_at"]), prompt["run_id"])


def assistant_turn(done: Event) -> Message:
    return Message(
        done["prompt"]["run_id"],
        "assistant",
        done["content"],
        _at(done["completed_at"]),
        done["prompt"]["run_id"],
        done["model"],
        done["finish_reason"],
        done["pool"],
    )


def refusal_turn(rejected: Event) -> Message:
    return Message(
        rejected["prompt"]["run_id"],
        "assistant",
        rejected["message"],
        _at(rejected["rejected_at"]),
        rejected["prompt"]["run_id"],
        None,
        rejected["code"],
    )


def review_row(moderated: Event, stage: str, run: Event, score: float | None, excerpt: str) -> SafetyDecision:
    """The review row of a moderation event; run: what names the run (a PromptAccepted, or the
    OutputModerated event itself, both with run_id, chat_id, user_id and tier)."""
    return SafetyDecision(
        uuid.UUID(moderated["event_id"]),
        _at(moderated["moderated_at"]),
        stage,
        moderated["action"],
        moderated["category"] or "unknown",
        score,
        moderated["policy_version"],
        run["run_id"],
        run["chat_id"],
        run["user_id"],
        run["tier"],
        excerpt,
    )


def input_decision(moderated: Event) -> SafetyDecision | None:
    """The review row of a prompt's moderation, when a rule matched (pure)."""
    if not moderated.get("action"):
        return None
    prompt = moderated["prompt"]
    score = (moderated.get("scores") or {}).get(moderated["category"])
    return review_row(moderated, "input", prompt, score, prompt["content"][:EXCERPT_CHARS])


def output_decision(moderated: Event) -> SafetyDecision | None:
    """The review row of an answer's moderation, when a rule matched (pure): the excerpt is not kept (the
    retracted text stays only in the reply log), the score is the highest any window got in the category."""
    if not moderated.get("action"):
        return None
    category = moderated["category"]
    scores = [w["scores"][category] for w in moderated["windows"] if category in w["scores"]]
    at = moderated["retracted_from"]
    excerpt = f"retracted from character {at}" if at is not None else ""
    return review_row(moderated, "output", moderated, max(scores) if scores else None, excerpt)


log = logging.getLogger(__name__)


def register(stage: Stage, conversations: Conversations, decisions: SafetyDecisions) -> None:
    async def stored_chat(prompt: Event) -> uuid.UUID | None:
        """The chat to write into, or None for a stateless run or a chat deleted meanwhile."""
        if not prompt.get("store", True):
            return None
        chat_id = uuid.UUID(prompt["chat_id"])
        if await conversations.get_chat(chat_id) is None:
            log.info("chat %s was deleted; not storing run %s", chat_id, prompt["run_id"])
            return None
        return chat_id

    async def store(prompt: Event, message: Message) -> None:
        """Write a turn of a chat that still exists, then look again: a chat deleted meanwhile may have had its
        messages erased before this write (MEMORY_CHANGED is another topic, handled beside this one), so its
        messages are erased once more and nothing of it outlives the delete."""
        if chat_id := await stored_chat(prompt):
            await conversations.put_message(chat_id, message)
            if await conversations.deleted(chat_id):
                await conversations.erase_messages(chat_id)
                log.info("chat %s was deleted while run %s was stored; erased again", chat_id, prompt["run_id"])

    async def forget_question(prompt: Event) -> None:
        await conversations.unput_message(uuid.UUID(prompt["chat_id"]), uuid.UUID(prompt["message_id"]))

    async def on_prompt(prompt: Event) -> None:
        await store(prompt, user_turn(prompt))
        # A question the edge refused after the log did not acknowledge it is not kept (storage/withdrawals.py):
        # looked at after the write, so a withdrawal settled before it or after it (the scheduler's RunRejected
        # `withdrawn`, on_rejected) removes it either way.
        if suspect(prompt, int(time.time() * 1000)) and await conversations.fate(*ids(prompt)) == WITHDRAWN:
            await forget_question(prompt)

    async def on_completed(done: Event) -> None:
        await store(done["prompt"], assistant_turn(done))  # how the run ended, too

    async def on_rejected(rejected: Event) -> None:
        prompt = rejected["prompt"]
        if rejected["code"] == WITHDRAWN:  # the edge answered 503: neither the question nor an answer is kept
            await forget_question(prompt)
            log.info("run %s was withdrawn by the edge: its question removed", prompt["run_id"])
            return
        await store(prompt, refusal_turn(rejected))

    async def on_moderated(moderated: Event) -> None:
        if decision := input_decision(moderated):
            await decisions.put(decision)

    async def on_output_moderated(moderated: Event) -> None:
        if decision := output_decision(moderated):
            await decisions.put(decision)

    async def on_feedback(feedback: Event) -> None:
        """The latest rating wins (events of one chat arrive in order); a rating of a deleted answer is dropped."""
        rating = None if feedback["rating"] == "none" else feedback["rating"]
        chat_id, message_id = uuid.UUID(feedback["chat_id"]), uuid.UUID(feedback["message_id"])
        if not await conversations.set_feedback(chat_id, message_id, rating):
            log.info("chat %s: feedback on message %s, which is gone; not stored", chat_id, message_id)

    async def on_changed(change: Event) -> None:
        """A deleted chat's messages go (the edge has deleted the chat, its runs and its changes)."""
        if change["action"] == "chat_deleted":
            chat_id = uuid.UUID(change["chat_id"])
            # once the edge has deleted the row (it tells first): a turn written after that erases itself
            gone = await conversations.deleted(chat_id, ERASE_WAIT_S)
            await conversations.erase_messages(chat_id)
            log.info("chat %s deleted: its messages erased%s", chat_id, "" if gone else " (its row is still there)")

    stage.consume(PROMPT_MODERATED, on_moderated)
    stage.consume(MEMORY_CHANGED, on_changed)
    stage.consume(FEEDBACK, on_feedback)
    stage.consume(OUTPUT_MODERATED, on_output_moderated)
    stage.consume(PROMPT_ACCEPTED, on_prompt)
    stage.consume(RUN_COMPLETED, on_completed)
    stage.consume(RUN_REJECTED, on_rejected)
