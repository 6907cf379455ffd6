"""The metering stage keeps a person's chats searchable (storage/search.py): RunCompleted | RunRejected -> the
run's question and answer as rows with their MiniLM vectors; MemoryChanged -> an edit replaces its row, a deleted
message or chat is removed. And the internal page `GET /v1/search` reads through (the embedded engine is this
process's). Runs that are not a chat's messages (the stateless OpenAI route, summaries, a question the edge
withdrew) are not indexed, as they are not stored.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Counter, Histogram

from processors.stage import Stage
from processors.usage_pages import in_thread
from safety.encoder import Encoder
from storage import search
from storage.clickhouse import Backend
from storage.search import Query
from storage.withdrawals import WITHDRAWN
from topics.events import MemoryChanged, PromptAccepted, RunCompleted, RunRejected

log = logging.getLogger(__name__)

INDEXED = Counter(
    "parley_search_rows_total", "Messages made searchable", ["outcome"]
)  # written | already stored
REMOVED = Counter("parley_search_removed_total", "Search rows removed or replaced", ["action"])
LAG = Histogram(
    "parley_search_lag_seconds",
    "From a run's end to its messages searchable",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
MODES = ("all", "words", "meaning")


@dataclass(frozen=True)
class Index:
    backend: Backend
    db: str
    encoder: Encoder

    def embedded(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rows with their contents' vectors."""
        vectors = self.encoder.embed([r["content"] for r in rows])
        return [
            r | {"embedding": [round(float(x), 6) for x in v]}
            for r, v in zip(rows, vectors, strict=True)
        ]

    def write(self, rows: list[dict[str, Any]]) -> int:
        """Rows without their vectors yet: embedded, then written."""
        return search.write(self.backend, self.db, self.embedded(rows)) if rows else 0

    def replace(self, row: dict[str, Any]) -> None:
        search.replace(self.backend, self.db, self.embedded([row])[0])


def row(
    prompt: PromptAccepted, message_id: str, role: str, content: str, at: int
) -> dict[str, Any]:
    return {
        "user_id": prompt["user_id"],
        "chat_id": prompt["chat_id"],
        "message_id": message_id,
        "role": role,
        "content": content,
        "created_at": at,
    }


def stored(prompt: PromptAccepted) -> bool:
    """Whether the run's messages are a chat's (persistence stores them)."""
    return prompt.get("store", True) and not prompt.get("summary")


def question(prompt: PromptAccepted) -> dict[str, Any]:
    return row(prompt, prompt["message_id"], "user", prompt["content"], prompt["created_at"])


def completed_rows(done: RunCompleted) -> list[dict[str, Any]]:
    prompt = done["prompt"]
    if not stored(prompt):
        return []
    return [
        question(prompt),
        row(prompt, prompt["run_id"], "assistant", done["content"], done["completed_at"]),
    ]


def rejected_rows(rejected: RunRejected) -> list[dict[str, Any]]:
    """A refused run's question stays in its chat (the refusal is Parley's words, not searched for)."""
    prompt = rejected["prompt"]
    if not stored(prompt) or rejected["code"] == WITHDRAWN:
        return []
    return [question(prompt)]


def index_rows(index: Index, rows: list[dict[str, Any]], ended_ms: list[int]) -> None:
    rows = [
        r for r in rows if r["content"].strip()
    ]  # an empty answer (an error) has nothing to find
    written = index.write(rows)
    INDEXED.labels("written").inc(written)
    INDEXED.labels("already stored").inc(len(rows) - written)
    now = datetime.now(UTC).timestamp()
    for ms in ended_ms:
        LAG.observe(max(0.0, now - ms / 1000))


async def on_completed(batch: list[RunCompleted], index: Index) -> None:
    rows = [r for done in batch for r in completed_rows(done)]
    await in_thread(index_rows, index, rows, [d["completed_at"] for d in batch])


async def on_rejected(batch: list[RunRejected], index: Index) -> None:
    rows = [r for rejected in batch for r in rejected_rows(rejected)]
    await in_thread(index_rows, index, rows, [r["rejected_at"] for r in batch])


def change(index: Index, event: MemoryChanged) -> None:
    user, chat, message = event["user_id"], event["chat_id"], event.get("message_id") or ""
    action = event["action"]
    if action == "person_erased":
        search.remove_person(index.backend, index.db, user)
        log.info("search: every entry of %s removed", user)
    elif action == "chat_deleted":
        search.remove(index.backend, index.db, user, chat, "", event["at"])
        log.info("search: chat %s removed", chat)
    elif action == "deleted" and message:
        search.remove(index.backend, index.db, user, chat, message, event["at"])
    elif action == "edited" and message:
        edited = {
            "user_id": user,
            "chat_id": chat,
            "message_id": message,
            "role": event.get("role") or "user",
            "content": event.get("content") or "",
            "created_at": event["at"],
        }
        index.replace(edited)
    else:
        return  # a context reset changes no message
    REMOVED.labels(action).inc()


async def on_changed(batch: list[MemoryChanged], index: Index) -> None:
    for event in batch:  # in order: an edit then a delete of one message ends deleted
        await in_thread(change, index, event)


def find(index: Index, user_id: str, text: str, mode: str, limit: int) -> list[dict[str, Any]]:
    """The person's best hits by words (ranked), then by meaning (those the words did not find)."""
    query = Query.parse(text)
    hits: list[dict[str, Any]] = []
    if mode in ("all", "words") and query.terms:
        rows = search.by_words(index.backend, index.db, user_id, query, limit)
        hits += [search.hit(r, "words", query) for r in rows]
    if mode in ("all", "meaning") and len(hits) < limit:
        vector = [float(x) for x in index.encoder.embed([text])[0]]
        seen = {h["message_id"] for h in hits}
        rows = search.by_meaning(index.backend, index.db, user_id, vector, limit)
        hits += [search.hit(r, "meaning", query) for r in rows if r["message_id"] not in seen]
    return hits[:limit]


def add(stage: Stage, index: Index) -> None:
    @stage.app.page("/search/{user_id}")
    async def searched(web: Any, request: Any, user_id: str) -> Any:
        """?q=&mode=all|words|meaning&limit=: the person's messages (the edge checked the query)."""
        stage.require_internal(request)
        q = request.query
        mode = q.get("mode", "all")
        limit = max(1, min(int(q.get("limit", 20)), 50))
        found = await in_thread(
            find, index, user_id, q.get("q", ""), mode if mode in MODES else "all", limit
        )
        return web.json({"data": found})
