"""A person's memories recalled into a run's context (docs/decisions/0024-memories-across-chats.md): the ones
nearest the new message (their own partition's vector index, storage/memories.py), above a similarity floor,
at most `memories_k` and `memories_tokens`, each screened for prompt injection like any context, then put in
the system prompt after the instructions. The run's context record names them, so `parley runs show`, a
replay and the answer itself show what was recalled."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from conversation import tokens
from conversation.context import relevant
from conversation.settings import ContextSettings
from storage.memories import Memories, PersonMemory
from topics.events import PromptAccepted

if TYPE_CHECKING:
    from conversation.gather import ContextGuard

HEADER = "\n\nWhat the person asked you to remember (use it where it helps):"


@dataclass
class Recalled:
    used: list[PersonMemory] = field(default_factory=list)
    withheld: list[str] = field(default_factory=list)  # memory:ID

    def system(self, system: str) -> str:
        """The system prompt with the recalled memories after it (pure)."""
        if not self.used:
            return system
        return system + HEADER + "".join(f"\n- {m.content}" for m in self.used)


async def embedded(guard: ContextGuard, text: str) -> np.ndarray:
    vectors = await asyncio.get_running_loop().run_in_executor(
        None, guard.moderator.encoder.embed, [text]
    )
    return np.asarray(vectors[0], dtype=np.float32)


async def recall_memories(
    prompt: PromptAccepted,
    store: Memories,
    guard: ContextGuard,
    query: np.ndarray,
    counter: tokens.ChatTokenizer,
    settings: ContextSettings,
) -> Recalled:
    """The sender's memories for this message, when the prompt says to recall them."""
    out = Recalled()
    if not prompt.get("memories"):
        return out
    found = await store.recall(prompt["user_id"], query.tolist(), settings.memories_candidates)
    vectors = np.array([m.embedding for m in found], dtype=np.float32).reshape(len(found), -1)
    picked = relevant(
        query,
        [m.content for m in found],
        vectors,
        settings.memories_k,
        settings.memories_min_similarity,
        1.0,  # a person's memories are few and short: by relevance alone
    )
    spent = 0
    for i in picked:
        memory = found[i]
        if await guard.screen(f"memory:{memory.id}", memory.content, prompt["tier"]):
            out.withheld.append(f"memory:{memory.id}")
            continue
        cost = counter.count(memory.content) + 2
        if spent + cost > settings.memories_tokens:
            continue
        spent += cost
        out.used.append(memory)
    return out
