"""Constructors of the records more than one producer writes: a run's prompt (the edge; the memory stage's
summary runs) and its reply deltas (the inference consumers; the scheduler's `queued`)."""

from __future__ import annotations

import uuid
from typing import Any, cast

from topics.clock import now_ms
from topics.events import (
    ChatMessage,
    Generation,
    Instruction,
    PromptAccepted,
    RunScheduled,
    Source,
    SummaryRequest,
    TokenDelta,
)


def prompt_accepted(
    *,
    run_id: str,
    chat_id: str,
    user_id: str,
    tier: str,
    message_id: str,
    content: str,
    max_tokens: int,
    model: str | None,
    reply_partition: int,
    prev_run_id: str | None,
    messages: list[ChatMessage] | None = None,
    temperature: float | None = None,
    store: bool = True,
    summary: SummaryRequest | None = None,
    instructions: list[Instruction] | None = None,
    parent_id: str | None = None,
    branched: bool = False,
    memories: bool = False,
    generation: Generation | None = None,
    documents: bool = False,
) -> PromptAccepted:
    """A user's message (or a memory stage's summary request) accepted as a new run."""
    return {
        "event_id": str(uuid.uuid4()),
        "run_id": run_id,
        "chat_id": chat_id,
        "user_id": user_id,
        "tier": tier,
        "message_id": message_id,
        "content": content,
        "max_tokens": max_tokens,
        "model": model,
        "reply_partition": reply_partition,
        "prev_run_id": prev_run_id,
        "messages": messages,
        "temperature": temperature,
        "store": store,
        "summary": summary,
        "instructions": instructions,
        "parent_id": parent_id,
        "branched": branched,
        "memories": memories,
        "generation": generation,
        "documents": documents,
        "created_at": now_ms(),
    }


def cited_sources(run: RunScheduled) -> list[Source]:
    """The passages of the chat's documents the run's context holds (shown and stored with its answer)."""
    context = run.get("context")
    return list(context.get("sources") or []) if context else []


def recalled_memories(run: RunScheduled) -> list[str]:
    """The sender's memories the run's context holds (shown with its answer)."""
    context = run.get("context")
    return list(context.get("memories") or []) if context else []


def token_delta(run: RunScheduled, seq: int, kind: str, **fields: Any) -> TokenDelta:
    """A TokenDelta record of a scheduled run: every optional field empty unless given."""
    prompt = run["prompt"]
    record: dict[str, Any] = {
        "run_id": prompt["run_id"],
        "chat_id": prompt["chat_id"],
        "seq": seq,
        "kind": kind,
        "text": "",
        "model": None,
        "finish_reason": None,
        "usage": None,
        "error_code": None,
        "error_message": None,
        "tokens": None,
        "pool": None,
        "estimated_wait_ms": None,
        "degraded_from": None,
        "category": None,
        "retract_from": None,
        "memories": [],
        "sources": [],
        "tool_calls": None,
        "tool_result": None,
        "emitted_at": now_ms(),
        "user_id": prompt["user_id"],
        **fields,
    }
    # the fields given are the caller's: the codec checks them at encode
    return cast(TokenDelta, record)
