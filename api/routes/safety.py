"""Admin: safety policies per tier (changed at run time on the policy topic) and the review list of recent
moderation decisions (blocks, warnings, retractions) for spotting false positives."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from api.auth import TIERS, Admin
from api.deps import Deps
from api.errors import ApiError
from api.routes.admin import publish
from safety.policy import ANY_TIER, Policy, Rule, to_record
from topics.pipeline import SAFETY_POLICIES

router = APIRouter(prefix="/v1/admin/safety")


class PolicyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str = Field(min_length=1, max_length=64)
    rules: list[Rule] = Field(max_length=64)
    on_error: str = Field("open", pattern="^(open|closed)$")


def policy_json(policy: Policy) -> dict[str, Any]:
    return policy.model_dump(mode="json")


def checked_tier(tier: str) -> str:
    if tier != ANY_TIER and tier not in TIERS:
        raise ApiError(
            404, f"No tier '{tier}'; one of {', '.join(TIERS)} or '*'.", "tier_not_found"
        )
    return tier


@router.get("/policies")
async def list_policies(deps: Deps, admin: Admin) -> dict[str, Any]:
    """The policy each tier runs under now, and the rows set on the topic."""
    rows = deps.policies.rows()
    return {
        "effective": {t: policy_json(deps.policies.for_tier(t)) for t in TIERS},
        "set": sorted(rows),
    }


@router.put("/policies/{tier}")
async def set_policy(deps: Deps, admin: Admin, tier: str, body: PolicyBody) -> dict[str, Any]:
    """Replace a tier's policy ('*': every tier without its own); the next message is moderated under it."""
    policy = Policy(version=body.version, rules=tuple(body.rules), on_error=body.on_error)
    record = to_record(checked_tier(tier), policy, admin.user_id)
    await publish(deps, tier, record, SAFETY_POLICIES, deps.policies)
    return {"tier": tier, "policy": policy_json(policy)}


@router.delete("/policies/{tier}", status_code=204)
async def clear_policy(deps: Deps, admin: Admin, tier: str) -> Response:
    await publish(deps, checked_tier(tier), None, SAFETY_POLICIES, deps.policies)
    return Response(status_code=204)


@router.get("/decisions")
async def recent_decisions(
    deps: Deps,
    admin: Admin,
    limit: int = Query(50, ge=1, le=500),
    days: int = Query(7, ge=1, le=90),
) -> dict[str, Any]:
    """Recent blocks, warnings and retractions, newest first: the false-positive review list."""
    found = await deps.decisions.recent(limit, days)
    return {
        "data": [
            {
                "id": str(d.decision_id),
                "at": d.at.isoformat(),
                "stage": d.stage,
                "action": d.action,
                "category": d.category,
                "score": d.score,
                "policy_version": d.policy_version,
                "run_id": d.run_id,
                "chat_id": d.chat_id,
                "user_id": d.user_id,
                "tier": d.tier,
                "excerpt": d.excerpt,
            }
            for d in found
        ]
    }
