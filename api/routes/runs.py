"""The run inspector for admins: one run's history across the topics and what was stored, and eval results.

The same history `parley runs show --json` prints (storage/history.py reads it from the log by the run's time),
drawn by /runs/{run_id}; the dashboard and each answer in the chat app link there.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Query
from fastapi.responses import FileResponse

from api.audit import TrailDep
from api.auth import Admin, Auditor
from api.deps import ConversationsDep, HttpDep, SettingsDep
from api.errors import ApiError
from api.routes.system import metering
from api.schemas import AuditPage
from runtime.window import Window
from storage import history
from topics.pipeline import PROMPT_ACCEPTED

router = APIRouter()
STATIC = Path(__file__).resolve().parent.parent / "static"


def _history(bootstrap: str, namespace: str, run_id: str) -> history.History:
    with Window(bootstrap, namespace) as window:
        return history.find(window, run_id)


@router.get("/v1/admin/runs/{run_id}")
async def inspect_run(
    settings: SettingsDep,
    http: HttpDep,
    conversations: ConversationsDep,
    admin: Admin,
    trail: TrailDep,
    run_id: str,
) -> dict[str, Any]:
    """{"run_id", "chat_id", "trace_id", "events": [{"topic", "partition", "offset", "type", "time", ...}],
    "stored": {"messages": [...], "usage": [...]}}. Each read is on the audit record, with whose run it is."""
    try:
        history.minted_ms(run_id)
    except ValueError as exc:
        raise ApiError(400, str(exc), "invalid_run_id", param="run_id") from None
    try:
        run = await asyncio.to_thread(
            _history, settings.kafka_bootstrap, settings.namespace, run_id
        )
    except history.RunNotFound as exc:
        raise ApiError(404, str(exc), "run_not_found") from None
    owner = next((r.event["user_id"] for r in run.records if r.topic is PROMPT_ACCEPTED), None)
    await trail("read.run", run_id, owner)
    chat_id = uuid.UUID(run.chat_id)
    found = [await conversations.get_message(chat_id, uuid.UUID(m)) for m in run.stored_ids]
    run.stored = {
        "messages": [
            {
                "message_id": m.id,
                "role": m.role,
                "content": m.content,
                "run_id": m.run_id,
                "model": m.model,
                "pool": m.pool,
                "finish_reason": m.finish_reason,
                "feedback": m.feedback,
                "created_at": m.created_at.isoformat(),
            }
            for m in found
            if m is not None
        ],
        "usage": (await metering(settings, http, f"/usage-rows/{quote(run.run_id, safe='')}"))[
            "data"
        ],
    }
    return run.as_json()


@router.get("/v1/admin/evals")
async def eval_results(
    settings: SettingsDep, http: HttpDep, admin: Admin, label: str | None = Query(None)
) -> dict[str, Any]:
    """Every eval label's totals (no label), or one label's case results (`parley eval run` writes them)."""
    return await metering(settings, http, "/eval-results", {"label": label} if label else None)


@router.get("/v1/admin/audit")
async def audit_log(
    settings: SettingsDep,
    http: HttpDep,
    auditor: Auditor,
    trail: TrailDep,
    since: Annotated[int | None, Query(description="epoch ms; default: 30 days ago")] = None,
    until: Annotated[int | None, Query(description="epoch ms; default: now")] = None,
    actor: Annotated[str | None, Query(max_length=256)] = None,
    target_user: Annotated[str | None, Query(max_length=256)] = None,
    action: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> AuditPage:
    """The audit record, newest first: every admin action and every read of another person's data (owner and
    auditors only; this read is recorded too)."""
    now_ms = int(time.time() * 1000)
    params: dict[str, Any] = {
        "since": since if since is not None else now_ms - 30 * 86_400_000,
        "until": until if until is not None else now_ms + 1,
        "limit": limit,
    }
    params |= {
        k: v for k, v in (("actor", actor), ("target_user", target_user), ("action", action)) if v
    }
    await trail("read.audit", "audit_log", detail={k: v for k, v in params.items() if k != "limit"})
    return AuditPage.model_validate(await metering(settings, http, "/audit", params))


@router.get("/runs/{run_id}", include_in_schema=False)
async def inspector(run_id: str) -> FileResponse:
    """The inspector page (drawn in the browser from /v1/admin/runs/{run_id}; it asks for a credential)."""
    return FileResponse(STATIC / "run.html", media_type="text/html")
