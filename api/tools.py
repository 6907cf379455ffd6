"""The registered MCP servers' tools a person picked for a message, checked and made the run's generation: the
tools named must exist and be offered to the person's role (runtime/mcp.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from api.auth import Principal
from api.errors import ApiError
from runtime.mcp import ToolServersView
from topics.events import Generation


def generation(view: ToolServersView, user: Principal, names: Sequence[str]) -> Generation | None:
    """The run's tools: the ones named, one of which the model must call first (the person chose them for
    this message), then may call again until it answers. None when none were named."""
    if not names:
        return None
    offered = {t["function"]["name"]: t for t in view.offered(user.role)}
    unknown = [n for n in names if n not in offered]
    if unknown:
        raise ApiError(
            400,
            f"No tool {', '.join(sorted(unknown))} is offered to you; GET /v1/tools lists yours.",
            "tool_not_offered",
            "tools",
        )
    return {
        "top_p": None,
        "seed": None,
        "stop": [],
        "presence_penalty": None,
        "frequency_penalty": None,
        "logit_bias": {},
        "response_format": None,
        "tools": json.dumps([offered[n] for n in dict.fromkeys(names)]),
        "tool_choice": "required",
        # one call a step: a small model asked for "one or more" repeats its first call until max_tokens
        "parallel_tool_calls": False,
        "server_tools": True,
    }
