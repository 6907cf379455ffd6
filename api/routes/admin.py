"""Admin: tier and per-user limits, changed at run time by an event on the limits topic (no restart), and ending
a person's API keys at once.

Every scheduler, inference consumer and edge replica follows the topic; a change answers once this replica
has read it back, and applies to the next message everywhere within moments.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from admission.limits import FIELDS, change, effective, row_key
from api.audit import TrailDep
from api.auth import TIERS, Admin
from api.deps import Deps, KeysDep, LedgerDep, LimitsDep, PeopleDep, ProducerDep, SettingsDep
from api.errors import ApiError
from api.retention import sweep
from api.schemas import AccessRevoked, LimitsList, TierLimits, UserBudget, UserOverrides
from api.settings import MAX_DAYS
from runtime.kafka import AsyncProducer
from runtime.tables import TopicTable
from topics.pipeline import LIMITS, Topic

log = logging.getLogger(__name__)
E = TypeVar("E")  # the table's event type
router = APIRouter(prefix="/v1/admin")


class LimitsPatch(BaseModel):
    """Fields to set; a field left out keeps the value below it (the tier's, or the built-in default)."""

    model_config = ConfigDict(extra="forbid")
    budget_tokens: int | None = Field(None, ge=0, strict=True)
    refill_tokens_per_hour: int | None = Field(None, ge=0, strict=True)
    max_concurrent: int | None = Field(None, ge=0, strict=True)
    priority: int | None = Field(None, ge=0, le=100, strict=True)
    max_queue_wait_s: float | None = Field(None, ge=0, strict=True)
    slot_share: float | None = Field(None, gt=0, le=1, strict=True)
    degrade: bool | None = Field(None, strict=True)
    max_runs_per_minute: int | None = Field(None, ge=0, strict=True)
    models: list[str] | None = Field(
        None, max_length=32, description="The models allowed; empty: every model served."
    )


async def publish(
    producer: AsyncProducer, view: TopicTable, topic: Topic[E], key: str, record: E | None
) -> None:
    """Write a table row (None: remove it) and wait (bounded) until this replica's view has it, so a read right
    after sees it."""
    if record is None:
        await producer.tombstone(topic, key)
    else:
        await producer.publish(topic, record, key=key)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        row = view.get(key)
        written = None if record is None else cast(dict[str, Any], record)["event_id"]
        if (record is None and row is None) or (
            record is not None and row and row["event_id"] == written
        ):
            return
        await asyncio.sleep(0.02)


def checked(body: LimitsPatch, served: tuple[str, ...]) -> dict[str, Any]:
    """The fields to set; 400 for a model this deployment does not serve."""
    unknown = [m for m in body.models or () if m not in served]
    if unknown:
        raise ApiError(
            400,
            f"Unknown model '{unknown[0]}'; served: {', '.join(served)}.",
            "model_not_found",
            "models",
        )
    return body.model_dump(exclude_none=True)


def overrides(row: Mapping[str, Any] | None) -> dict[str, Any]:
    return {f: row[f] for f in FIELDS if row and row.get(f) is not None}


@router.get("/limits")
async def list_limits(limits: LimitsDep, admin: Admin) -> LimitsList:
    rows = limits.rows()
    users = {k.split(":", 1)[1]: overrides(r) for k, r in rows.items() if k.startswith("user:")}
    tiers = {t: effective(rows, None, t) for t in TIERS}
    return LimitsList(tiers=tiers, users=dict(sorted(users.items())))


@router.put("/limits/tiers/{tier}")
async def set_tier(
    producer: ProducerDep,
    limits: LimitsDep,
    admin: Admin,
    trail: TrailDep,
    settings: SettingsDep,
    tier: str,
    body: LimitsPatch,
) -> TierLimits:
    if tier not in TIERS:
        raise ApiError(404, f"No tier '{tier}'; one of {', '.join(TIERS)}.", "tier_not_found")
    key = row_key("tier", tier)
    fields = {**overrides(limits.get(key)), **checked(body, settings.models)}
    await trail("limits.set_tier", tier, detail=fields)
    await publish(producer, limits, LIMITS, key, change("tier", tier, fields, admin.user_id))
    return TierLimits(tier=tier, limits=limits.tier(tier))


@router.put("/limits/users/{user_id}")
async def set_user(
    producer: ProducerDep,
    limits: LimitsDep,
    admin: Admin,
    trail: TrailDep,
    settings: SettingsDep,
    user_id: str,
    body: LimitsPatch,
) -> UserOverrides:
    key = row_key("user", user_id)
    fields = {**overrides(limits.get(key)), **checked(body, settings.models)}
    await trail("limits.set_user", user_id, user_id, fields)
    await publish(producer, limits, LIMITS, key, change("user", user_id, fields, admin.user_id))
    return UserOverrides(user_id=user_id, overrides=overrides(limits.get(key)))


@router.delete("/limits/users/{user_id}", status_code=204)
async def clear_user(
    producer: ProducerDep, limits: LimitsDep, admin: Admin, trail: TrailDep, user_id: str
) -> Response:
    await trail("limits.clear_user", user_id, user_id)
    await publish(producer, limits, LIMITS, row_key("user", user_id), None)
    return Response(status_code=204)


@router.get("/users/{user_id}/budget")
async def user_budget(
    views: LimitsDep,
    ledger: LedgerDep,
    admin: Admin,
    trail: TrailDep,
    user_id: str,
    tier: str = "free",
) -> UserBudget:
    """A user's bucket as the schedulers see it (tier: the user's tier, which lives in their credentials)."""
    if tier not in TIERS:
        raise ApiError(400, f"tier must be one of {', '.join(TIERS)}.", "invalid_value", "tier")
    await trail("read.budget", user_id, user_id)
    limits = views.for_user(user_id, tier)
    remaining, in_flight = await ledger.standing(user_id, limits)
    return UserBudget(
        user_id=user_id, remaining_budget=remaining, in_flight=in_flight, limits=limits
    )


@router.post("/users/{user_id}/revoke")
async def revoke_access(
    keys: KeysDep, people: PeopleDep, admin: Admin, trail: TrailDep, user_id: str
) -> AccessRevoked:
    """End every API key and browser session a person holds, at once: each is refused on its next request on
    every replica (someone who left, a key that leaked). Signed development tokens end when they expire."""
    await trail("access.revoke", user_id, user_id)
    revoked = await keys.revoke_all(user_id)
    ended = await people.end_all(user_id)
    log.info(
        "admin %s revoked the %d live API keys and %d sessions of %s",
        admin.user_id,
        revoked,
        ended,
        user_id,
    )
    return AccessRevoked(user_id=user_id, revoked_keys=revoked, ended_sessions=ended)


class SweepIn(BaseModel):
    dry_run: bool = Field(True, strict=True, description="only list what would be deleted")
    as_of: datetime | None = Field(
        None,
        description="sweep as if it were this time (a preview ahead, or the policy applied early); now if null",
    )


class SweptChat(BaseModel):
    user_id: str
    chat_id: str
    last_active_at: str


class SweepOut(BaseModel):
    dry_run: bool
    as_of: str
    data: list[SweptChat]


@router.post("/retention/sweep")
async def sweep_now(
    admin: Admin, trail: TrailDep, deps: Deps, body: SweepIn | None = None
) -> SweepOut:
    """The chats past their age (each owner's days, at most PARLEY_MAX_CHAT_AGE_DAYS) found, and unless
    `dry_run`, deleted now, as the edge's hourly sweep would."""
    body = body or SweepIn()
    at = (body.as_of or datetime.now(UTC)).astimezone(UTC)
    if abs(at - datetime.now(UTC)) > timedelta(days=MAX_DAYS):
        raise ApiError(
            400, "as_of must be within a hundred years of now.", "invalid_value", "as_of"
        )
    await trail(
        "retention.sweep", "chats", None, {"dry_run": body.dry_run, "as_of": at.isoformat()}
    )
    swept = await sweep(deps, at, body.dry_run)
    log.info("admin %s swept chats as of %s: %d %s", admin.user_id, at.isoformat(), len(swept),
             "found" if body.dry_run else "deleted")  # fmt: skip
    data = [
        SweptChat(
            user_id=s.user_id, chat_id=str(s.chat_id), last_active_at=s.last_active_at.isoformat()
        )
        for s in swept
    ]
    return SweepOut(dry_run=body.dry_run, as_of=at.isoformat(), data=data)
