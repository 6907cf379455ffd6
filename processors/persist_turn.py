"""PromptAccepted | RunCompleted | RunRejected -> Cassandra messages (idempotent: keyed by the event's ids).

Runs of the stateless OpenAI route (store = false) are not written as messages; they are metered and stay
in the log. A deleted chat gets no new rows from runs that were still in flight when it was deleted.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime

from processors.stage import Stage
from storage.cassandra import Conversations, Message
from topics.codec import Event
from topics.pipeline import PROMPT_ACCEPTED, RUN_COMPLETED, RUN_REJECTED


def _at(value: datetime | int) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromtimestamp(value / 1000, UTC)


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


log = logging.getLogger(__name__)


def register(stage: Stage, conversations: Conversations) -> None:
    async def stored_chat(prompt: Event) -> uuid.UUID | None:
        """The chat to write into, or None for a stateless run or a chat deleted meanwhile."""
        if not prompt.get("store", True):
            return None
        chat_id = uuid.UUID(prompt["chat_id"])
        if await conversations.get_chat(chat_id) is None:
            log.info("chat %s was deleted; not storing run %s", chat_id, prompt["run_id"])
            return None
        return chat_id

    async def on_prompt(prompt: Event) -> None:
        if chat_id := await stored_chat(prompt):
            await conversations.put_message(chat_id, user_turn(prompt))

    async def on_completed(done: Event) -> None:
        if chat_id := await stored_chat(done["prompt"]):
            await conversations.put_message(chat_id, assistant_turn(done))
            await conversations.finish_run(chat_id, uuid.UUID(done["prompt"]["run_id"]), done["finish_reason"])

    async def on_rejected(rejected: Event) -> None:
        if chat_id := await stored_chat(rejected["prompt"]):
            await conversations.put_message(chat_id, refusal_turn(rejected))
            await conversations.finish_run(chat_id, uuid.UUID(rejected["prompt"]["run_id"]), rejected["code"])

    stage.consume(PROMPT_ACCEPTED, on_prompt)
    stage.consume(RUN_COMPLETED, on_completed)
    stage.consume(RUN_REJECTED, on_rejected)
