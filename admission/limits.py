"""Per-tier and per-user limits: built-in defaults, overridden at run time by events on the limits topic.

A user's effective limits are the built-in tier defaults, then the tier's row, then the user's row (a field
left null in a row keeps the value below it). Every scheduler, inference consumer and edge replica follows
the topic, so a change applies to the next message everywhere without a restart.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from typing import Any, cast

from pydantic import BaseModel

from runtime.tables import TopicTable
from topics.clock import now_ms
from topics.codec import Event
from topics.events import LimitsChanged
from topics.pipeline import LIMITS


class Limits(BaseModel):
    model_config = {"frozen": True}

    budget_tokens: int  # token bucket: the most a user can spend at once
    refill_tokens_per_hour: int  # the bucket refills continuously at this rate
    max_concurrent: int  # runs in flight per user
    priority: int  # higher is served first when capacity is tight
    max_queue_wait_s: float  # estimated wait beyond which a run is degraded or rejected with 429
    # share of an engine's slots this tier may hold; the rest stays free for higher tiers
    slot_share: float
    degrade: bool  # under pressure, move to a smaller pool before rejecting
    max_runs_per_minute: int = 0  # requests (runs) one user may start in any 60 s; 0: no limit
    models: tuple[str, ...] = ()  # the models this tier or user may use; empty: every model served


FIELDS = tuple(Limits.model_fields)

# Runs at or below this priority are background work (conversation summaries): an engine starts one only
# while no reply is running or waiting, and stops it when a reply arrives (the memory stage asks again).
BACKGROUND_PRIORITY = -100

DEFAULT_TIERS = {
    "free": Limits(
        budget_tokens=50_000,
        refill_tokens_per_hour=50_000,
        max_concurrent=2,
        priority=0,
        max_queue_wait_s=1.0,
        slot_share=0.5,
        degrade=True,
        max_runs_per_minute=30,
    ),
    "pro": Limits(
        budget_tokens=500_000,
        refill_tokens_per_hour=500_000,
        max_concurrent=4,
        priority=1,
        max_queue_wait_s=0.25,
        slot_share=1.0,
        degrade=False,
    ),
    "enterprise": Limits(
        budget_tokens=5_000_000,
        refill_tokens_per_hour=5_000_000,
        max_concurrent=16,
        priority=2,
        max_queue_wait_s=0.5,
        slot_share=1.0,
        degrade=False,
    ),
}


def tier_cap(slots: int, share: float) -> int:
    """The slots of an engine a tier may hold: its share, at least one (the consumer enforces it, the
    scheduler and the edge estimate waits with it)."""
    return slots if share >= 1.0 else max(1, math.floor(slots * share))


def model_refusal(limits: Limits, model: str, tier: str) -> str | None:
    """Why a person under these limits may not use the model, or None when they may."""
    if not limits.models or model in limits.models:
        return None
    return (
        f"The {tier} tier may not use the model '{model}'; it may use: {', '.join(limits.models)}."
    )


def allowed_default(limits: Limits, default: str) -> str | None:
    """The model a run without one goes to: None (the deployment's default) unless the limits exclude it,
    then the first they allow."""
    return None if not limits.models or default in limits.models else limits.models[0]


def row_key(scope: str, name: str) -> str:
    return f"{scope}:{name}"


def effective(rows: dict[str, Event], user_id: str | None, tier: str) -> Limits:
    """Defaults, then the tier's row, then the user's row (pure)."""
    values: dict[str, Any] = DEFAULT_TIERS.get(tier, DEFAULT_TIERS["free"]).model_dump()
    keys = [row_key("tier", tier)] + ([row_key("user", user_id)] if user_id else [])
    for key in keys:
        row = rows.get(key)
        if row:
            values.update({f: row[f] for f in FIELDS if row.get(f) is not None})
    return Limits(**values)


def change(scope: str, name: str, fields: Mapping[str, Any], changed_by: str) -> LimitsChanged:
    """A LimitsChanged record; fields not given stay null (inherit)."""
    if scope not in ("tier", "user"):
        raise ValueError(f"limits are set per tier or per user, not per {scope!r}")
    record = {
        "event_id": str(uuid.uuid4()),
        "scope": scope,
        "name": name,
        **{f: fields.get(f) for f in FIELDS},
        "changed_by": changed_by,
        "changed_at": now_ms(),
    }
    return cast(
        LimitsChanged, record
    )  # FIELDS are the record's limit fields (tests/unit/test_events.py)


class LimitsView(TopicTable):
    def __init__(self, bootstrap: str, namespace: str, reader: str) -> None:
        super().__init__(bootstrap, LIMITS, namespace, reader)

    def for_user(self, user_id: str, tier: str) -> Limits:
        return effective(self._rows, user_id, tier)

    def tier(self, tier: str) -> Limits:
        return effective(self._rows, None, tier)

    def tiers_for(self, user_id: str, tier: str) -> dict[str, Limits]:
        """Every tier's limits, with the user's own in place of its tier's (what admission compares)."""
        return {name: self.tier(name) for name in DEFAULT_TIERS} | {
            tier: self.for_user(user_id, tier)
        }
