"""PromptModerated -> RunScheduled | RunRejected.

Blocked prompts are rejected; allowed ones get their context (system prompt + the chat's recent turns + the
new message) and a model pool: the one serving the requested model, or the smallest whose context holds the
prompt and its answer. Budgets, priorities and queues are issue 5; summaries and retrieval are issue 7.
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


def reject(prompt: Event, code: str, message: str, category: str | None = None) -> Event:
    return {
        "event_id": str(uuid.uuid4()),
        "prompt": prompt,
        "code": code,
        "message": message,
        "category": category,
        "retry_after_s": None,
        "rejected_at": int(time.time() * 1000),
    }


def estimate_tokens(messages: list[dict[str, str]]) -> int:
    """A deliberately high estimate of a prompt's tokens (English runs about 4 characters per token with
    SmolLM2's tokenizer; 3 leaves room), plus the chat template's few tokens per message. Issue 7 replaces
    it with the serving model's own tokenizer."""
    return sum(len(m["content"]) // 3 + 4 for m in messages)


class TooLong(Exception):
    pass


def choose_pool(prompt: Event, messages: list[dict[str, str]], settings: ProcessorSettings) -> tuple[str, str]:
    """(pool, model) for a run (pure). A requested model picks its pool; a prompt that does not fit there
    goes to the smallest pool whose context holds it (the answer names the model that served it)."""
    need = estimate_tokens(messages) + prompt["max_tokens"]
    by_size = sorted(settings.pools.items(), key=lambda item: item[1].context)
    wanted = prompt["model"] or settings.pools[settings.default_pool].model
    for name, pool in by_size:
        if pool.model == wanted and need <= pool.context:
            return name, pool.model
    for name, pool in by_size:
        if need <= pool.context:
            return name, pool.model
    largest = by_size[-1][1].context
    raise TooLong(
        f"This conversation needs about {need} tokens with its answer; the largest model here holds {largest}. "
        "Start a new chat or ask for a shorter answer."
    )


def assemble(prompt: Event, history: list[Message], settings: ProcessorSettings) -> Event:
    """The run to schedule (pure): the history is the chat's turns before this message, oldest first.

    A prompt from the OpenAI-compatible route carries its whole conversation and is used as sent.
    Raises TooLong when no pool can hold it.
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
    pool, model = choose_pool(prompt, messages, settings)
    return {
        "event_id": str(uuid.uuid4()),
        "prompt": prompt,
        "pool": pool,
        "model": model,
        "messages": messages,
        "context_turns": len(earlier),
        "scheduled_at": int(time.time() * 1000),
    }


async def history_for(prompt: Event, conversations: Conversations, settings: ProcessorSettings) -> list[Message]:
    """The chat's turns before this message. Waits (bounded) until the previous answer is persisted."""
    if not prompt["prev_run_id"]:
        return []  # the chat's first turn: nothing earlier to read (saves a query on the path to the first token)
    chat_id = uuid.UUID(prompt["chat_id"])
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
            refusal = reject(
                prompt, "content_filter", "This request was declined by the content policy.", moderated["category"]
            )
            await stage.publish(RUN_REJECTED, refusal, partition=prompt["reply_partition"])
            return
        history = [] if prompt.get("messages") else await history_for(prompt, conversations, stage.settings)
        try:
            run = assemble(prompt, history, stage.settings)
        except TooLong as exc:
            log.info("run %s rejected: %s", prompt["run_id"], exc)
            refusal = reject(prompt, "context_length_exceeded", str(exc))
            await stage.publish(RUN_REJECTED, refusal, partition=prompt["reply_partition"])
            return
        await stage.publish(RUN_SCHEDULED[run["pool"]], run, key=prompt["chat_id"])

    stage.consume(PROMPT_MODERATED, handle)
