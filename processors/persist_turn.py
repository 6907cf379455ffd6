"""PromptAccepted | RunCompleted | RunRejected -> Cassandra messages (idempotent: keyed by the event's ids)."""

from __future__ import annotations

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


def register(stage: Stage, conversations: Conversations) -> None:
    async def on_prompt(prompt: Event) -> None:
        await conversations.put_message(uuid.UUID(prompt["chat_id"]), user_turn(prompt))

    async def on_completed(done: Event) -> None:
        await conversations.put_message(uuid.UUID(done["prompt"]["chat_id"]), assistant_turn(done))

    async def on_rejected(rejected: Event) -> None:
        await conversations.put_message(uuid.UUID(rejected["prompt"]["chat_id"]), refusal_turn(rejected))

    stage.consume(PROMPT_ACCEPTED, on_prompt)
    stage.consume(RUN_COMPLETED, on_completed)
    stage.consume(RUN_REJECTED, on_rejected)
