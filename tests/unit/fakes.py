"""In-memory stand-ins for a stage's stores and its log, for unit tests of the handlers (the real ones are tested
on the real services under tests/stack/). Each keeps what it was asked to do, in the shape a test asserts on."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from admission.limits import DEFAULT_TIERS, Limits, effective
from storage.ids import new_id
from storage.ledger import Account, Decision, decide
from storage.memory import Summary
from storage.rows import Change, Message, overlay
from topics import codec
from topics.clock import now_ms
from topics.pipeline import PROMPT_ACCEPTED, RUN_COMPLETED, RUN_REJECTED, Topic


def decoded(topic: Topic[Any], record: dict[str, Any]) -> Any:
    """A record as a stage is handed it: through the topic's Avro schema, its defaults filled in."""
    return codec.decode(topic.schema, codec.encode(topic.schema, record))


@dataclass
class Sent:
    topic: str
    record: Any
    key: str | None
    partition: int | None


class FakeLog:
    """A stage's `publish`: every record is encoded with its topic's schema (a record the topic's Avro schema
    refuses fails the test, as it would fail the stage), then kept."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []

    async def __call__(self, topic: Topic[Any], record: Any, *, key: str | None = None, partition: int | None = None):
        codec.encode(topic.schema, record)
        self.sent.append(Sent(topic.name, record, key, partition))

    def on(self, topic: Topic[Any]) -> list[Sent]:
        return [s for s in self.sent if s.topic == topic.name]


class FakeConversations:
    def __init__(self) -> None:
        self.chats: dict[uuid.UUID, SimpleNamespace] = {}
        self.messages: dict[uuid.UUID, dict[str, Message]] = {}
        self.edits: dict[uuid.UUID, dict[str, Change]] = {}
        self.fates: dict[tuple[str, str], str] = {}
        self.feedback: dict[str, str | None] = {}

    def add_chat(self, user_id: str = "u", **fields: Any) -> uuid.UUID:
        chat_id = new_id()
        row = {"chat_id": chat_id, "user_id": user_id, "context_from": None, "memory_changed_at": None, **fields}
        self.chats[chat_id] = SimpleNamespace(**row)
        return chat_id

    async def get_chat(self, chat_id: uuid.UUID) -> Any:
        return self.chats.get(chat_id)

    async def deleted(self, chat_id: uuid.UUID, wait_s: float = 0.0) -> bool:
        return chat_id not in self.chats

    async def put_message(self, chat_id: uuid.UUID, message: Message, owner: str = "") -> None:
        self.messages.setdefault(chat_id, {})[message.id] = message

    async def skeleton(self, chat_id: uuid.UUID) -> list[tuple[str, str | None, str]]:
        rows = sorted(self.messages.get(chat_id, {}).values(), key=lambda m: uuid.UUID(m.id).time)
        return [(m.id, m.parent_id, m.role) for m in rows]

    async def unput_message(self, chat_id: uuid.UUID, message_id: uuid.UUID) -> None:
        self.messages.get(chat_id, {}).pop(str(message_id), None)

    async def erase_messages(self, chat_id: uuid.UUID) -> None:
        self.messages.pop(chat_id, None)

    async def fate(self, chat_id: uuid.UUID, run_id: uuid.UUID) -> str | None:
        return self.fates.get((str(chat_id), str(run_id)))

    async def settle_fate(self, chat_id: uuid.UUID, run_id: uuid.UUID, fate: str) -> str:
        return self.fates.setdefault((str(chat_id), str(run_id)), fate)

    async def set_feedback(self, chat_id: uuid.UUID, message_id: uuid.UUID, rating: str | None) -> bool:
        if str(message_id) not in self.messages.get(chat_id, {}):
            return False
        self.feedback[str(message_id)] = rating
        return True

    async def changes(self, chat_id: uuid.UUID) -> dict[str, Change]:
        return dict(self.edits.get(chat_id, {}))

    async def messages_after(self, chat_id: uuid.UUID, after: uuid.UUID | None, limit: int, changes=None):
        rows = sorted(self.messages.get(chat_id, {}).values(), key=lambda m: uuid.UUID(m.id).time)
        edits = self.edits.get(chat_id, {}) if changes is None else changes
        after_rows = [m for m in rows if after is None or uuid.UUID(m.id).time > after.time]
        return overlay(after_rows, edits)[:limit]  # the store's own overlay of the user's edits and deletes


class FakeDecisions:
    def __init__(self) -> None:
        self.rows: list[Any] = []

    async def put(self, decision: Any) -> None:
        self.rows.append(decision)


class FakeUsage:
    """One row per run, as the real store keeps it: a row for a run already stored is skipped."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def write(self, rows: list[dict[str, Any]]) -> int:
        new = [r for r in rows if r["run_id"] not in self.rows]
        self.rows.update((r["run_id"], r) for r in new)
        return len(new)


class FakeMemory:
    def __init__(self) -> None:
        self.vectors: dict[uuid.UUID, dict[str, tuple[str, str, int]]] = {}  # chat -> message -> (role, text, µs)
        self.summaries: dict[uuid.UUID, list[Summary]] = {}
        self.resets: list[uuid.UUID] = []

    async def remember(self, chat_id, message_id, role, text, vector, at_us, owner) -> None:
        assert len(vector) == 3  # FakeEncoder's
        self.vectors.setdefault(chat_id, {})[str(message_id)] = (role, text, at_us)

    async def forget(self, chat_id, message_id, at_us) -> None:
        self.vectors.get(chat_id, {}).pop(str(message_id), None)

    async def reset(self, chat_id, at_us) -> None:
        self.vectors.pop(chat_id, None)
        self.summaries.pop(chat_id, None)
        self.resets.append(chat_id)

    async def latest_summary(self, chat_id) -> Summary | None:
        versions = self.summaries.get(chat_id, [])
        return max(versions, key=lambda s: s.version) if versions else None

    async def put_summary(self, chat_id, summary: Summary, owner: str) -> None:
        self.summaries.setdefault(chat_id, []).append(summary)

    async def drop_summary(self, chat_id, version: int) -> None:
        self.summaries[chat_id] = [s for s in self.summaries.get(chat_id, []) if s.version != version]

    async def drop_summaries_covering(self, chat_id, message_id) -> None:
        at = message_id.time
        self.summaries[chat_id] = [s for s in self.summaries.get(chat_id, []) if uuid.UUID(s.through).time < at]


class FakeEncoder:
    def embed(self, texts: list[str]):
        import numpy as np

        return [np.array([float(len(t)), 1.0, 0.0]) for t in texts]


class FakeLedger:
    """The budget ledger's rules (the pure `decide`) over accounts kept in memory."""

    def __init__(self, deadline_ms: int = 300_000) -> None:
        self.accounts: dict[str, Account] = {}
        self.runs: dict[str, Decision] = {}
        self.charged: dict[str, int] = {}
        self.scheduled: set[str] = set()
        self.settled: dict[str, int] = {}
        self.deadline_ms = deadline_ms

    def account(self, user_id: str) -> Account:
        return self.accounts.setdefault(user_id, Account(refilled_at=now_ms()))

    async def look(self, user_id: str, run_id: str):
        before = self.runs.get(run_id)
        if before is not None and run_id in self.scheduled:
            before = replace(before, scheduled=True)
        return self.account(user_id), before

    async def admit(self, user_id, run_id, estimate, limits: Limits, pool, partition, known=None) -> Decision:
        if run_id in self.runs:
            return self.runs[run_id]
        account = self.account(user_id)
        decision = decide(account, limits, estimate, now_ms(), self.deadline_ms)
        if decision.admitted:
            in_flight = {**account.in_flight, run_id: now_ms()}
            self.accounts[user_id] = replace(account, used=account.used + estimate, in_flight=in_flight)
            self.runs[run_id] = replace(decision, pool=pool, partition=partition, decided_at=now_ms())
            self.charged[run_id] = estimate
        return decision

    async def mark_scheduled(self, user_id: str, run_id: str) -> None:
        self.scheduled.add(run_id)

    async def settle(self, user_id: str, run_id: str, actual: int, limits: Limits) -> bool:
        if run_id not in self.charged or run_id in self.settled:
            return False
        account = self.account(user_id)
        in_flight = {r: at for r, at in account.in_flight.items() if r != run_id}
        used = account.used - self.charged[run_id] + actual
        self.accounts[user_id] = replace(account, used=used, in_flight=in_flight)
        self.settled[run_id] = actual
        return True


class FakeLimits:
    def __init__(self, **tiers: Limits) -> None:
        self.tiers = tiers

    def for_user(self, user_id: str, tier: str) -> Limits:
        return self.tiers.get(tier) or effective({}, user_id, tier)

    def tiers_for(self, user_id: str, tier: str) -> dict[str, Limits]:
        return {name: self.for_user(user_id, name) for name in DEFAULT_TIERS}


@dataclass
class FakePools:
    partitions: dict[str, int] = field(default_factory=lambda: {"small": 4, "large": 4})
    placed: list[tuple[str, str, str, int | None]] = field(default_factory=list)

    def loads(self) -> dict[str, list[Any]]:
        return {}

    def admitted(self, run_id: str, pool: str, tier: str, partition: int | None) -> None:
        self.placed.append((run_id, pool, tier, partition))


class FakeGuard:
    def __init__(self) -> None:
        self.screened: list[str] = []

    async def screen(self, item_id: str, text: str, tier: str) -> bool:
        self.screened.append(item_id)
        return True


def at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


# -- events as a stage is handed them ---------------------------------------------------------------------


def run(coro):
    return asyncio.run(coro)


def prompt(chat_id=None, content="Hello there", **extra):
    message_id = str(new_id())  # the question's id, then its run's (the answer's): a chat's order
    run_id = str(new_id())
    return decoded(
        PROMPT_ACCEPTED,
        {
            "event_id": str(uuid.uuid4()),
            "run_id": run_id,
            "chat_id": str(chat_id or new_id()),
            "user_id": "u",
            "tier": "free",
            "message_id": message_id,
            "content": content,
            "max_tokens": 16,
            "model": None,
            "reply_partition": 3,
            "prev_run_id": None,
            "created_at": now_ms() - 60_000,
            **extra,
        },
    )


def completed(p, content="Bonjour", finish_reason="stop", **extra):
    return decoded(
        RUN_COMPLETED,
        {
            "event_id": str(uuid.uuid4()),
            "prompt": p,
            "pool": "small",
            "model": "smollm2-135m-instruct",
            "content": content,
            "finish_reason": finish_reason,
            "usage": {"prompt_tokens": 1000, "completion_tokens": 200, "cached_tokens": 400},
            "ttft_ms": 30.0,
            "duration_ms": 400.0,
            "completed_at": now_ms(),
            **extra,
        },
    )


def rejected(p, code="token_budget_exceeded", message="Over budget."):
    record = {"event_id": str(uuid.uuid4()), "prompt": p, "code": code, "message": message, "rejected_at": now_ms()}
    return decoded(RUN_REJECTED, record)
