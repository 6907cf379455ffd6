"""Moderation decisions that matched a rule (blocks, warnings, retractions), newest first per UTC day: the
admins' review list for false positives. Written by the persistence stage from the moderation events; the
decision id is the event's, so a redelivery rewrites the same row. The excerpt is sealed with its person's key
(storage/at_rest.py)."""

from __future__ import annotations

import uuid
from dataclasses import astuple, dataclass, replace
from datetime import UTC, datetime, timedelta

from cassandra.cluster import Session

from storage.at_rest import opened, seal
from storage.ids import utc
from storage.session import Store, create_tables

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS {ks}.safety_decisions (
         day text, at timestamp, decision_id uuid, stage text, action text, category text, score double,
         policy_version text, run_id text, chat_id text, user_id text, tier text, excerpt text,
         PRIMARY KEY ((day), at, decision_id)) WITH CLUSTERING ORDER BY (at DESC, decision_id DESC)""",
)


def create_schema(session: Session, keyspace: str) -> None:
    create_tables(session, keyspace, SCHEMA, ())


@dataclass(frozen=True)
class SafetyDecision:
    decision_id: uuid.UUID
    at: datetime
    stage: str  # input | output
    action: str  # block | warn | log
    category: str
    score: float | None
    policy_version: str
    run_id: str
    chat_id: str
    user_id: str
    tier: str
    excerpt: str  # the start of the text decided on, for review


class SafetyDecisions(Store):
    WRITERS = {"safety_decisions": "persistence"}

    def __init__(self, session: Session, keyspace: str, writer: str) -> None:
        super().__init__(session, keyspace, writer)
        ks, p = keyspace, self._prepare
        self._insert = p(
            f"INSERT INTO {ks}.safety_decisions (day, decision_id, at, stage, action, category, score, "
            "policy_version, run_id, chat_id, user_id, tier, excerpt) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self._whose = p(f"SELECT at, decision_id, user_id FROM {ks}.safety_decisions WHERE day = ?")
        self._forget = p(
            f"DELETE FROM {ks}.safety_decisions WHERE day = ? AND at = ? AND decision_id = ?"
        )
        self._list = p(
            f"SELECT decision_id, at, stage, action, category, score, policy_version, run_id, chat_id, user_id, "
            f"tier, excerpt FROM {ks}.safety_decisions WHERE day = ? LIMIT ?"
        )

    async def put(self, d: SafetyDecision) -> None:
        sealed = replace(d, excerpt=seal(d.user_id, d.excerpt) or "")
        # the columns in the dataclass's order
        await self._run(self._insert, (_day(sealed.at), *astuple(sealed)))

    async def forget_person(self, user_id: str, days: int) -> int:
        """Delete the person's decisions of the last `days` UTC days (older ones have expired); how many."""
        found = 0
        today = datetime.now(UTC)
        for back in range(days + 1):
            day = _day(today - timedelta(days=back))
            rows = await self._run(self._whose, (day,))
            mine = [
                (self._forget, (day, r.at, r.decision_id)) for r in rows if r.user_id == user_id
            ]
            if mine:
                await self._all(*mine)
            found += len(mine)
        return found

    async def recent(self, limit: int, days: int = 7) -> list[SafetyDecision]:
        """The newest decisions, today first, looking back at most `days` UTC days."""
        found: list[SafetyDecision] = []
        now = datetime.now(UTC)
        for back in range(days):
            if len(found) >= limit:
                break
            rows = await self._run(
                self._list, (_day(now - timedelta(days=back)), limit - len(found))
            )
            decided = (SafetyDecision(row.decision_id, utc(row.at), *row[2:]) for row in rows)
            found += [replace(d, excerpt=opened(d.excerpt)) for d in decided]
        return found


def _day(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d")
