"""PromptModerated -> RunScheduled | RunRejected.

Minimal here: blocked prompts are rejected, allowed ones are routed to the default pool with their context
(system prompt + the chat's recent turns + the new message). Budgets, priorities and queues are issue 5;
summaries and retrieval are issue 7.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from processors.settings import ProcessorSettings
from processors.stage import Stage
from storage.cassandra import Conversations, Message
from topics.codec import Event
from topics.pipeline import PROMPT_MODERATED, RUN_REJECTED, RUN_SCHEDULED

log = logging.getLogger(__name__)


def reject(moderated: Event) -> Event:
    return {
        "event_id": str(uuid.uuid4()),
        "prompt": moderated["prompt"],
        "code": "content_filter",
        "message": "This request was declined by the content policy.",
        "category": moderated["category"],
        "retry_after_s": None,
        "rejected_at": int(time.time() * 1000),
    }


def assemble(prompt: Event, history: list[Message], settings: ProcessorSettings) -> Event:
    """The run to schedule (pure): the history is the chat's turns before this message, oldest first.

    A prompt from the OpenAI-compatible route carries its whole conversation and is used as sent.
    """
    if prompt.get("messages"):
        messages = [dict(m) for m in prompt["messages"]]
        earlier: list[Any] = messages[:-1]
    else:
        earlier = [m for m in history if m.id != prompt["message_id"] and m.content]
        earlier = earlier[-settings.context_messages :]
        messages = [{"role": "system", "content": settings.system_prompt}]
        messages += [{"role": m.role, "content": m.content} for m in earlier]
        messages.append({"role": "user", "content": prompt["content"]})
    return {
        "event_id": str(uuid.uuid4()),
        "prompt": prompt,
        "pool": settings.default_pool,
        "model": prompt["model"] or settings.default_model,
        "messages": messages,
        "context_turns": len(earlier),
        "scheduled_at": int(time.time() * 1000),
    }


async def history_for(prompt: Event, conversations: Conversations, settings: ProcessorSettings) -> list[Message]:
    """The chat's turns before this message. Waits (bounded) until the previous answer is persisted."""
    chat_id = uuid.UUID(prompt["chat_id"])
    if prompt["prev_run_id"]:
        deadline = time.monotonic() + settings.prev_turn_wait_s
        while not await conversations.has_message(chat_id, uuid.UUID(prompt["prev_run_id"])):
            if time.monotonic() > deadline:
                log.warning(
                    "chat %s: previous answer %s not persisted after %.1fs; scheduling without it",
                    prompt["chat_id"],
                    prompt["prev_run_id"],
                    settings.prev_turn_wait_s,
                )
                break
            await asyncio.sleep(0.05)
    recent = await conversations.recent_messages(chat_id, settings.context_messages + 2)
    before = uuid.UUID(prompt["message_id"]).time
    return [m for m in recent if uuid.UUID(m.id).time < before]


def register(stage: Stage, conversations: Conversations) -> None:
    async def handle(moderated: Event) -> None:
        prompt = moderated["prompt"]
        if moderated["decision"] == "blocked":
            await stage.publish(RUN_REJECTED, reject(moderated), partition=prompt["reply_partition"])
            return
        history = [] if prompt.get("messages") else await history_for(prompt, conversations, stage.settings)
        await stage.publish(RUN_SCHEDULED, assemble(prompt, history, stage.settings), key=prompt["chat_id"])

    stage.consume(PROMPT_MODERATED, handle)
