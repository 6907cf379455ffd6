"""Models, usage, health and metrics."""

from __future__ import annotations

import httpx
from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.app import Deps
from api.auth import CurrentUser
from api.errors import ApiError

router = APIRouter()


@router.get("/v1/models")
async def models(deps: Deps, user: CurrentUser) -> dict[str, object]:
    data = [{"id": m, "object": "model", "created": 0, "owned_by": "parley"} for m in deps.settings.models]
    return {"object": "list", "data": data}


@router.get("/v1/usage")
async def usage(deps: Deps, user: CurrentUser) -> dict[str, object]:
    """The caller's metered totals (metering) and what their budget lets them spend now (the ledger)."""
    try:
        response = await deps.http.get(f"{deps.settings.metering_url}/usage/{user.user_id}")
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise ApiError(503, "Usage data is unavailable right now; try again shortly.", "usage_unavailable") from exc
    totals = response.json()
    limits = deps.limits.for_user(user.user_id, user.tier)
    remaining, in_flight = await deps.ledger.standing(user.user_id, limits)
    return {
        "user_id": user.user_id,
        "tier": user.tier,
        "runs": totals["runs"],
        "prompt_tokens": totals["prompt_tokens"],
        "completion_tokens": totals["completion_tokens"],
        "cached_tokens": totals["cached_tokens"],
        "total_tokens": totals["prompt_tokens"] + totals["completion_tokens"],
        "remaining_budget": remaining,
        "budget": {
            "budget_tokens": limits.budget_tokens,
            "refill_tokens_per_hour": limits.refill_tokens_per_hour,
            "in_flight": len(in_flight),
            "max_concurrent": limits.max_concurrent,
        },
    }


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/metrics")
async def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
