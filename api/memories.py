"""A person's memories as the edge makes them: from settings, or from a chat message that says "remember that
…". Each is checked before anything is written: its length, the person's count, and the safety classifier
(the input policy and the prompt-injection screen applied to context), so what is kept can go into any of the
person's prompts; the same encoder gives the embedding the scheduler recalls it by (conversation/memories.py).
The classifier loads on the first memory an edge process checks, not at start-up.
Design: docs/decisions/0024-memories-across-chats.md."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from api.errors import ApiError
from api.settings import ApiSettings
from safety.moderator import Moderator
from safety.policy import PolicyView
from storage.ids import new_id
from storage.memories import Memories, PersonMemory

if TYPE_CHECKING:
    from api.auth import Principal

log = logging.getLogger(__name__)

# "Remember that I prefer metric units.", "Please remember: my team is Platform": one line, said outright. A
# question is not a command, nor "Remember this list: …", which asks the chat, not the person's memory.
COMMAND = re.compile(
    r"^\s*(?:please\s+)?remember(?:\s+that\s+|\s*:\s*)(?P<fact>[^?\n]+?)[.!]?\s*$", re.I
)


def command(content: str, longest: int) -> str | None:
    """The fact a message asks to remember, or None when it is not such a command or the fact is longer than
    a memory may be (then it is an ordinary message) (pure)."""
    found = COMMAND.match(content)
    fact = " ".join(found.group("fact").split()) if found else ""
    return fact if 0 < len(fact) <= longest else None


class MemoryGuard:
    """The safety classifier at the edge, for memories only: built on first use, in a worker thread."""

    def __init__(self, policies: PolicyView) -> None:
        self.policies = policies
        self._moderator: Moderator | None = None
        self._loading = asyncio.Lock()

    async def moderator(self) -> Moderator:
        async with self._loading:
            if self._moderator is None:
                loop = asyncio.get_running_loop()
                self._moderator = await loop.run_in_executor(None, Moderator)
                log.info("memory checks: safety classifier loaded")
        return self._moderator

    async def checked(self, content: str, tier: str) -> list[float]:
        """The memory's embedding; 400 memory_rejected when the input policy blocks it or it reads as
        instructions to the assistant (it would go into every later prompt)."""
        moderator = await self.moderator()
        policy = self.policies.for_tier(tier)
        for stage in ("input", "context"):
            verdict = await moderator.check_async(policy, stage, [content])
            if verdict.blocked:
                category = verdict.decision.category
                log.info("memory refused at %s: %s", stage, category)
                reason = (
                    "it reads as instructions to the assistant"
                    if stage == "context"
                    else f"the safety policy blocks it ({category})"
                )
                raise ApiError(
                    400, f"This memory cannot be kept: {reason}.", "memory_rejected", "content"
                )
        vectors = await asyncio.get_running_loop().run_in_executor(
            None, moderator.encoder.embed, [content]
        )
        return [float(x) for x in vectors[0]]


class MemoryOut(BaseModel):
    id: str
    object: Literal["memory"] = "memory"
    content: str
    source: str = Field(description="settings, or chat:CHAT_ID for one asked for in a chat")
    created_at: str
    updated_at: str

    @classmethod
    def of(cls, m: PersonMemory) -> MemoryOut:
        return cls(
            id=m.id,
            content=m.content,
            source=m.source,
            created_at=m.created_at.isoformat(),
            updated_at=m.updated_at.isoformat(),
        )


def allowed(settings: ApiSettings) -> None:
    if not settings.memories:
        raise ApiError(403, "Memories are switched off on this deployment.", "memories_disabled")


def checked_content(settings: ApiSettings, content: str) -> str:
    content = " ".join(content.split())
    if not content:
        raise ApiError(400, "A memory must not be empty.", "empty_content", "content")
    if len(content) > settings.max_memory_chars:
        raise ApiError(
            400,
            f"A memory may be at most {settings.max_memory_chars} characters; this one has {len(content)}.",
            "memory_too_long",
            "content",
        )
    return content


async def remember(
    settings: ApiSettings,
    store: Memories,
    guard: MemoryGuard,
    user: Principal,
    content: str,
    source: str,
    existing: PersonMemory | None = None,
) -> PersonMemory:
    """Check and keep a memory (a new one, or `existing` with new text); nothing is written when a check fails."""
    allowed(settings)
    content = checked_content(settings, content)
    if existing is None and len(await store.kept(user.user_id, settings.max_memories + 1)) >= (
        settings.max_memories
    ):
        raise ApiError(
            409,
            f"You keep {settings.max_memories} memories, the most allowed; delete one first.",
            "too_many_memories",
        )
    embedding = await guard.checked(content, user.tier)
    memory_id = uuid.UUID(existing.id) if existing else new_id()
    first = existing.created_at if existing else None
    kept = await store.put(user.user_id, memory_id, content, embedding, source, first)
    log.info("%s %s memory %s", user.user_id, "edited" if existing else "kept", kept.id)
    return kept
