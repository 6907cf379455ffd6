"""Where event records and API shapes meet: reply records -> SSE events, a cancel -> RunControl."""

from __future__ import annotations

import json
import uuid
from typing import Any

from api.replies import ACCEPTED, REJECTED, Reply
from topics.clock import now_ms
from topics.events import RunControl


def run_control(*, run_id: str, chat_id: str, user_id: str, reason: str) -> RunControl:
    return {
        "event_id": str(uuid.uuid4()),
        "run_id": run_id,
        "chat_id": chat_id,
        "user_id": user_id,
        "action": "cancel",
        "reason": reason,
        "requested_at": now_ms(),
    }


def sse(reply: Reply) -> dict[str, Any]:
    """One SSE event (sse-starlette's dict form) for one reply record."""
    if reply.kind == ACCEPTED:  # the edge's own: no log record behind it, so no cursor
        kept = "Your request is in; the scheduler has not placed it yet. The answer follows."
        return {"event": "run.accepted", "data": json.dumps({**reply.accepted, "message": kept})}
    if reply.kind == REJECTED:
        return rejection(reply)
    r = reply.delta
    data: dict[str, Any]
    if reply.kind == "queued":
        event, data = (
            "run.queued",
            {
                "run_id": r["run_id"],
                "chat_id": r["chat_id"],
                "model": r["model"],
                "pool": r.get("pool"),
                "estimated_wait_ms": r.get("estimated_wait_ms"),
                "degraded_from": r.get("degraded_from"),
                "memories": list(r.get("memories") or []),
                "sources": [dict(s) for s in r.get("sources") or []],
            },
        )
    elif reply.kind == "started":
        event, data = (
            "run.started",
            {"run_id": r["run_id"], "chat_id": r["chat_id"], "model": r["model"]},
        )
    elif reply.kind == "delta" and (
        use := r.get("tool_result")
    ):  # a registered server's tool answered
        event, data = "tool.result", {"run_id": r["run_id"], **use}
    elif reply.kind == "delta" and (calls := r.get("tool_calls")):
        event, data = "tool.calls", {"run_id": r["run_id"], "tool_calls": json.loads(calls)}
    elif reply.kind == "delta":
        event, data = "token", {"run_id": r["run_id"], "delta": r["text"]}
    elif reply.kind == "completed":
        usage = r["usage"] or {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}
        event, data = (
            "run.completed",
            {
                "run_id": r["run_id"],
                "finish_reason": r["finish_reason"],
                "model": r["model"],
                "usage": usage,
            },
        )
    elif (
        reply.kind == "moderation"
    ):  # output moderation cut the answer: the client drops text from retract_from
        event, data = (
            "moderation",
            {
                "run_id": r["run_id"],
                "action": "retract",
                "category": r["category"],
                "retract_from": r["retract_from"],
                "message": r["error_message"],
            },
        )
    else:  # error
        event, data = (
            "error",
            {"run_id": r["run_id"], "code": r["error_code"], "message": r["error_message"]},
        )
    return {"event": event, "id": reply.cursor, "data": json.dumps(data)}


def rejection(reply: Reply) -> dict[str, Any]:
    r = reply.rejection
    data: dict[str, Any]
    run_id = r["prompt"]["run_id"]
    if r["code"] == "content_filter":
        event = "moderation"
        data = {
            "run_id": run_id,
            "action": "refused",
            "category": r.get("category"),
            "message": r["message"],
        }
    else:  # a refusal the scheduler made after the stream started: its Retry-After goes with it
        event, data = "error", {"run_id": run_id, "code": r["code"], "message": r["message"]}
        if r.get("retry_after_s") is not None:
            data["retry_after_s"] = r["retry_after_s"]
    return {"event": event, "id": reply.cursor, "data": json.dumps(data)}
