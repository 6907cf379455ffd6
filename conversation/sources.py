"""The chat's documents in a run's context (docs/decisions/0027-documents-in-a-chat.md): all their passages
when they fit `documents_tokens`, otherwise the ones nearest the new message (the chat's partition of the
passages' vector index, storage/documents.py) within it. Each passage is screened for prompt injection like any
context (a document is untrusted text), numbered, and put in the system prompt after the memories, so the
model can cite [n]; the run's context record names them, and the answer shows them."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from conversation import tokens
from conversation.memories import embedded
from conversation.settings import ContextSettings
from storage.documents import Documents, StoredPassage
from topics.events import PromptAccepted, Source

if TYPE_CHECKING:
    from conversation.gather import ContextGuard

HEADER = (
    "\n\nPassages of the documents attached to this chat. Answer from them where they help, and cite the "
    "passage you used by its number, as [1]."
)


@dataclass
class Cited:
    used: list[Source] = field(default_factory=list)
    withheld: list[str] = field(default_factory=list)  # document:ID:INDEX

    def system(self, system: str) -> str:
        """The system prompt with the passages after it (pure)."""
        if not self.used:
            return system
        listed = "".join(
            f"\n[{s['n']}] {s['name']}{', ' + s['place'] if s['place'] else ''}:\n{s['text']}"
            for s in self.used
        )
        return system + HEADER + listed


async def cited_passages(
    prompt: PromptAccepted,
    store: Documents,
    guard: ContextGuard,
    query: np.ndarray | None,
    counter: tokens.ChatTokenizer,
    settings: ContextSettings,
) -> Cited:
    """The passages for this message, when the prompt says the chat has documents read."""
    out = Cited()
    if not prompt.get("documents"):
        return out
    chat_id = uuid.UUID(prompt["chat_id"])
    listed, statuses = await store.listed(chat_id), await store.statuses(chat_id)
    names = {d.document_id: d.name for d in listed}  # a document deleted is not listed
    ready = {i for i, s in statuses.items() if s.state == "ready" and i in names}
    found = [p for p in await store.passages(chat_id) if p.document_id in ready]
    if sum(p.tokens for p in found) > settings.documents_tokens:  # too much whole: the nearest
        if query is None:
            query = await embedded(guard, prompt["content"])
        near = await store.nearest(chat_id, query.tolist(), settings.documents_candidates)
        found = [p for p in near if p.document_id in ready]
    spent = 0
    for passage in found:
        if await guard.screen(key(passage), passage.content, prompt["tier"]):
            out.withheld.append(key(passage))
            continue
        cost = counter.count(passage.content) + 8
        if spent + cost > settings.documents_tokens:
            continue
        spent += cost
        out.used.append(source(len(out.used) + 1, passage, names[passage.document_id]))
    return out


def key(passage: StoredPassage) -> str:
    return f"document:{passage.document_id}:{passage.index}"


def source(n: int, passage: StoredPassage, name: str) -> Source:
    return {
        "n": n,
        "document_id": str(passage.document_id),
        "name": name,
        "place": passage.place,
        "text": passage.content,
    }
