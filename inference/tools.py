"""A run's calls to registered MCP servers' tools (the app's tools, PromptAccepted generation.server_tools): the
engine's answer asks for calls, this consumer makes them, and generation goes on with their results, until the
model answers or the run has made its limit of calls (then it must answer in words: tool_choice none).

Each call's result is published as a record on the run's reply partition before the model reads it, so the log
holds the whole exchange: the app shows it live, `parley runs show` and replay read it, and a consumer taking the
run over continues after the last result instead of calling again (inference/takeover.py). A result passes the
context guard first, as any text the system puts into a prompt does: one it flags reaches the model as a notice.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from conversation.gather import ContextGuard
from inference.engine import Outcome, Request
from inference.metrics import TOOL_CALLS
from runtime import mcp
from runtime.mcp import ToolServersView
from topics.events import Generation, ToolUse

log = logging.getLogger(__name__)

WITHHELD = "The tool's result was held back: the content policy flagged it as an attempt to instruct the model."


def server_tools(generation: Generation | None) -> bool:
    return bool(generation and generation.get("server_tools") and generation.get("tools"))


def offered(generation: Generation) -> set[str]:
    return {t["function"]["name"] for t in json.loads(generation["tools"] or "[]")}


class ToolSteps:
    """Calls the tools a run's answer asks for, within what its edge offered it and the consumer's limit."""

    def __init__(
        self,
        servers: ToolServersView,
        guard: ContextGuard | None,
        limit: int,
        generation: Generation,
        tier: str,
        run_id: str,
        made: int = 0,
    ) -> None:
        self.servers, self.guard, self.limit = servers, guard, limit
        self.offered = offered(generation)
        self.tier, self.run_id = tier, run_id
        self.made = made  # calls made so far (a run taken over counts its predecessor's)

    async def call(self, calls: list[dict[str, Any]], stop: asyncio.Event) -> list[ToolUse] | None:
        """Make the calls (side by side), each answered within its server's limits; None when the run is
        stopped (cancelled, handed off) first: a call in flight is abandoned, not waited for."""
        work: asyncio.Future[list[ToolUse]] = asyncio.ensure_future(
            asyncio.gather(*(self._one(c) for c in calls))
        )
        stopped: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
        await asyncio.wait([work, stopped], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not work.done():
            work.cancel()
            return None
        return list(work.result())

    async def _one(self, made: dict[str, Any]) -> ToolUse:
        name, arguments = made["function"]["name"], made["function"]["arguments"]
        self.made += 1
        where = mcp.split(name)
        server = self.servers.get(where[0]) if where else None
        if name not in self.offered or where is None:
            result = mcp.Result("unavailable", f"There is no tool {name} for this conversation.")
        elif server is None:
            result = mcp.Result("unavailable", f"The tool {name} has been removed.")
        else:
            result = await mcp.call(server, where[1], arguments)
        content = result.content
        if result.status == "ok" and self.guard is not None:
            if await self.guard.screen(f"tool:{made['id']}", content, self.tier):
                result = replace(result, status="blocked")
                content = WITHHELD
        TOOL_CALLS.labels(where[0] if where and server else "-", result.status).inc()
        log.info("run %s: tool %s answered %s in %.0f ms (%d chars)", self.run_id, name,
                 result.status, result.duration_ms, len(content))  # fmt: skip
        return {
            "call_id": made["id"],
            "name": name,
            "arguments": arguments,
            "status": result.status,
            "content": content,
            "duration_ms": result.duration_ms,
        }

    def next_request(self, request: Request, messages: list[dict[str, Any]], spent: int) -> Request:
        """The next step: the exchange so far in its messages; the tools may be used again (auto) until the
        limit, then the model must answer in words."""
        options = {k: v for k, v in request.options.items() if k != "response_format"}
        options["tool_choice"] = "auto" if self.made < self.limit else "none"
        return replace(
            request,
            messages=messages,
            options=options,
            forced_calls=False,
            max_tokens=request.max_tokens - spent,
            continuation="",
        )


def exchange(calls: list[dict[str, Any]], text: str, uses: list[ToolUse]) -> list[dict[str, Any]]:
    """The messages a step adds to the prompt: the answer's calls, then each call's result."""
    said = {"role": "assistant", "content": text, "tool_calls": calls}
    return [said] + [
        {"role": "tool", "tool_call_id": u["call_id"], "content": u["content"]} for u in uses
    ]


def merged(before: Outcome | None, step: Outcome | None) -> Outcome | None:
    """Two steps of a run as one outcome: the tokens of both (each step's prompt is metered, as the engine read
    it), the text of both, the end and the calls of the later."""
    if before is None or step is None:
        return step or before
    return Outcome(
        finish_reason=step.finish_reason,
        prompt_tokens=before.prompt_tokens + step.prompt_tokens,
        completion_tokens=before.completion_tokens + step.completion_tokens,
        cached_tokens=before.cached_tokens + step.cached_tokens,
        first_token_at=before.first_token_at or step.first_token_at,
        text=before.text + step.text,
        pieces=before.pieces + step.pieces,
        tool_calls=step.tool_calls,
    )


def pending(steps: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The calls of the last step a predecessor published whose results it did not (it died between)."""
    answered: set[str] = set()
    for message in reversed(steps):
        if message["role"] == "assistant":
            return [c for c in message["tool_calls"] if c["id"] not in answered]
        answered.add(message["tool_call_id"])
    return []
