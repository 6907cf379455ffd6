"""Models, who am I, usage (`router`); the dashboard page, health and metrics (`probes`, outside /v1)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import httpx
from fastapi import APIRouter, Query, Response
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from admission.limits import model_refusal
from api.audit import TrailDep
from api.auth import CurrentUser
from api.deps import HttpDep, LedgerDep, LimitsDep, PeopleDep, RepliesDep, SettingsDep
from api.errors import ApiError
from api.schemas import Alive, Budget, Me, Model, ModelList, Ready, Usage
from api.settings import ApiSettings
from runtime.settings import Pool
from topics.clock import now_ms

router = APIRouter()
probes = APIRouter()
STATIC = Path(__file__).resolve().parent.parent / "static"
MAX_REPORT_MS = 92 * 24 * 3_600_000
MAX_EPOCH_MS = 4_102_444_800_000  # 2100-01-01: the usage tables' DateTime columns end in 2106


@router.get("/v1/models")
async def models(settings: SettingsDep, views: LimitsDep, user: CurrentUser) -> ModelList:
    """The models served, the default first: each pool's model with its description and context length, and
    whether the caller's tier may use it (the chat app's model picker)."""
    limits = views.for_user(user.user_id, user.tier)
    pools: dict[str, Pool] = {}
    for pool in settings.pools.values():
        pools.setdefault(pool.model, pool)
    return ModelList(
        data=[
            Model(
                id=m,
                description=pools[m].description,
                context_length=pools[m].context,
                allowed=model_refusal(limits, m, user.tier) is None,
            )
            for m in settings.models
        ]
    )


async def metering(
    settings: ApiSettings,
    http: httpx.AsyncClient,
    path: str,
    params: dict[str, str | int] | None = None,
    what: tuple[str, str] = ("Usage data", "usage_unavailable"),
) -> dict[str, Any]:
    """A read from the metering stage, which owns the usage and search tables (the embedded engine is one
    process's); `what`: what is unavailable when it does not answer, and the error's code."""
    try:
        url, headers = f"{settings.metering_url}{path}", settings.internal_headers()
        response = await http.get(url, params=params, headers=headers, timeout=30)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise ApiError(
            503, f"{what[0]} is unavailable right now; try again shortly.", what[1]
        ) from exc
    return dict(response.json())


@router.get("/v1/me")
async def me(user: CurrentUser, people: PeopleDep) -> Me:
    """Who the credential speaks for (the chat app shows it, and checks its session with it)."""
    person = await people.person(user.user_id) if user.session else None
    return Me(
        user_id=user.user_id,
        tier=user.tier,
        admin=user.admin,
        via_key=user.via_key,
        role=user.role,
        name=person.name if person and person.name else None,
        csrf_token=user.csrf or None,
    )


@router.get("/v1/usage")
async def usage(
    settings: SettingsDep,
    http: HttpDep,
    views: LimitsDep,
    ledger: LedgerDep,
    user: CurrentUser,
) -> Usage:
    """The caller's metered totals (metering) and what their budget lets them spend now (the ledger)."""
    start = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    since: dict[str, str | int] = {"since": int(start.timestamp() * 1000)}
    totals = await metering(settings, http, f"/usage/{quote(user.user_id, safe='')}", since)
    limits = views.for_user(user.user_id, user.tier)
    remaining, in_flight = await ledger.standing(user.user_id, limits)
    budget = Budget(
        budget_tokens=limits.budget_tokens,
        refill_tokens_per_hour=limits.refill_tokens_per_hour,
        in_flight=len(in_flight),
        max_concurrent=limits.max_concurrent,
    )
    return Usage(
        user_id=user.user_id,
        tier=user.tier,
        runs=totals["runs"],
        prompt_tokens=totals["prompt_tokens"],
        completion_tokens=totals["completion_tokens"],
        cached_tokens=totals["cached_tokens"],
        total_tokens=totals["prompt_tokens"] + totals["completion_tokens"],
        cost_usd=totals["cost_usd"],
        period_start=start.isoformat(),
        period_tokens=totals["period_tokens"],
        remaining_budget=remaining,
        budget=budget,
    )


@router.get("/v1/usage/report")
async def usage_report(
    settings: SettingsDep,
    http: HttpDep,
    user: CurrentUser,
    trail: TrailDep,
    since: Annotated[
        int | None,
        Query(ge=0, le=MAX_EPOCH_MS, description="epoch ms; default: `until` minus 24 hours"),
    ] = None,
    until: Annotated[
        int | None, Query(ge=0, le=MAX_EPOCH_MS, description="epoch ms; default: now")
    ] = None,
    user_id: Annotated[
        str | None, Query(description="admins: one user's view; default: everyone")
    ] = None,
) -> dict[str, Any]:
    """What the usage dashboard draws: totals, time series (tokens, cost, latency percentiles, rejections,
    safety interventions), by tier and model. An admin sees everyone's, or one user's; anyone else their own."""
    until = until if until is not None else now_ms()
    since = since if since is not None else until - 24 * 3_600_000
    if not 0 < until - since <= MAX_REPORT_MS:
        raise ApiError(
            400,
            "`since` must be before `until`, at most 92 days earlier.",
            "invalid_request_error",
            "since",
        )
    if not user.admin:
        if user_id not in (None, user.user_id):
            raise ApiError(
                403, "Only an admin can read another user's usage.", "permission_denied", "user_id"
            )
        user_id = user.user_id
    elif (
        user_id != user.user_id
    ):  # an admin reading everyone's usage or another person's: on the record
        await trail("read.usage", user_id or "everyone", user_id, {"since": since, "until": until})
    params: dict[str, str | int] = {"since": since, "until": until}
    if user_id is not None:
        params["user_id"] = user_id
    return await metering(settings, http, "/usage-report", params)


@probes.get("/dashboard", include_in_schema=False)
async def dashboard() -> FileResponse:
    """The usage dashboard (charts drawn in the browser from /v1/usage/report; the page asks for a credential)."""
    return FileResponse(STATIC / "dashboard.html", media_type="text/html")


@probes.get("/s/{share_id}", include_in_schema=False)
async def shared_page(share_id: str) -> FileResponse:
    """A shared chat's page (drawn from /v1/shared/{id}; read only)."""
    return FileResponse(STATIC / "shared.html", media_type="text/html")


@probes.get("/admin", include_in_schema=False)
async def admin_area() -> FileResponse:
    """The admin area (people, keys, limits, safety policies, the audit log), drawn from the admin routes with
    the browser's session."""
    return FileResponse(STATIC / "admin.html", media_type="text/html")


@probes.get("/livez")
async def livez() -> Alive:
    """Alive: the event loop answers (a liveness probe restarts the process only when this stops answering)."""
    return Alive()


NOT_READY = "No reply partition held yet (a standby, or its group is rebalancing)."


@probes.get(
    "/readyz", response_model=Ready, responses={503: {"model": Ready, "description": NOT_READY}}
)
async def readyz(replies: RepliesDep) -> Response:
    """Ready once this replica holds reply partitions (while its group rebalances, or as a standby with none:
    503, alive but not to be sent traffic); which it holds is in the body."""
    owned = list(replies.partitions)
    body = Ready(status="ok" if owned else "no_reply_partition", reply_partitions=owned)
    return JSONResponse(body.model_dump(), status_code=200 if owned else 503)


@probes.get("/metrics", response_class=PlainTextResponse)
async def metrics() -> Response:
    """Prometheus's text exposition format."""
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
