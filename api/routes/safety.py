"""Admin: safety policies per tier (changed at run time on the policy topic) and the review list of recent
moderation decisions (blocks, warnings, retractions) for spotting false positives."""

from __future__ import annotations

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from api.audit import TrailDep
from api.auth import TIERS, Admin
from api.deps import DecisionsDep, PoliciesDep, ProducerDep
from api.errors import ApiError
from api.routes.admin import publish
from api.schemas import Decision, DecisionPage, PolicyList, TierPolicy
from safety.policy import ANY_TIER, Policy, Redactable, Rule, to_record
from topics.pipeline import SAFETY_POLICIES

router = APIRouter(prefix="/v1/admin/safety")


class PolicyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str = Field(min_length=1, max_length=64)
    rules: list[Rule] = Field(max_length=64)
    on_error: str = Field("open", pattern="^(open|closed)$")
    redact: list[Redactable] = Field([], max_length=4)


def checked_tier(tier: str) -> str:
    if tier != ANY_TIER and tier not in TIERS:
        raise ApiError(
            404, f"No tier '{tier}'; one of {', '.join(TIERS)} or '*'.", "tier_not_found"
        )
    return tier


@router.get("/policies")
async def list_policies(policies: PoliciesDep, admin: Admin) -> PolicyList:
    """The policy each tier runs under now, and the rows set on the topic."""
    effective = {t: policies.for_tier(t) for t in TIERS}
    return PolicyList(effective=effective, set=sorted(policies.rows()))


@router.put("/policies/{tier}")
async def set_policy(
    producer: ProducerDep,
    policies: PoliciesDep,
    admin: Admin,
    trail: TrailDep,
    tier: str,
    body: PolicyBody,
) -> TierPolicy:
    """Replace a tier's policy ('*': every tier without its own); the next message is moderated under it."""
    policy = Policy(
        version=body.version,
        rules=tuple(body.rules),
        on_error=body.on_error,
        redact=tuple(dict.fromkeys(body.redact)),
    )
    record = to_record(checked_tier(tier), policy, admin.user_id)
    await trail("safety.set_policy", tier, detail=body.model_dump())
    await publish(producer, policies, SAFETY_POLICIES, tier, record)
    return TierPolicy(tier=tier, policy=policy)


@router.delete("/policies/{tier}", status_code=204)
async def clear_policy(
    producer: ProducerDep, policies: PoliciesDep, admin: Admin, trail: TrailDep, tier: str
) -> Response:
    await trail("safety.clear_policy", tier)
    await publish(producer, policies, SAFETY_POLICIES, checked_tier(tier), None)
    return Response(status_code=204)


@router.get("/decisions")
async def recent_decisions(
    decisions: DecisionsDep,
    admin: Admin,
    trail: TrailDep,
    limit: int = Query(50, ge=1, le=500),
    days: int = Query(7, ge=1, le=90),
) -> DecisionPage:
    """Recent blocks, warnings and retractions, newest first: the false-positive review list (people's words:
    each read is on the audit record)."""
    await trail("read.safety_decisions", f"last {days} days")
    return DecisionPage(data=[Decision.of(d) for d in await decisions.recent(limit, days)])
