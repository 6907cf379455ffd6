"""MCP servers an admin registered (the tool-servers table) and calls to their tools over Streamable HTTP, with
the official `mcp` SDK (docs/decisions/0028-mcp-tools.md).

A server's tools are offered to the model as OpenAI functions named `<server>__<tool>`. Each call opens its own
session (the handshake, the call, the close): a call holds nothing between runs, so any inference consumer can
make any call, and a server that restarted is simply reached again. A call is bounded by its server's timeout
and result size: a result over the size is refused whole (`too_large`), never cut, so the model never reads
half a table as if it were all of it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from runtime.tables import TopicTable
from topics.pipeline import TOOL_SERVERS

log = logging.getLogger(__name__)

SEPARATOR = "__"
# a server's name: lower-case letters, digits and single dashes (never the separator)
SERVER_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")
# OpenAI's rule for a function's name, which the qualified name must keep
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class Unreachable(Exception):
    """The server could not be reached, or did not answer as an MCP server."""


@dataclass(frozen=True)
class Result:
    status: str  # ok | error | timeout | too_large | unavailable
    content: str  # the result's text (ok), or what the model is told instead
    duration_ms: float = 0.0


def qualified(server: str, tool: str) -> str:
    return f"{server}{SEPARATOR}{tool}"


def split(name: str) -> tuple[str, str] | None:
    server, sep, tool = name.partition(SEPARATOR)
    return (server, tool) if sep and server and tool else None


def _headers(auth_env: str | None) -> dict[str, str]:
    if not auth_env:
        return {}
    token = os.environ.get(auth_env)
    if not token:
        raise Unreachable(f"the environment variable {auth_env} holding its token is not set")
    return {"Authorization": f"Bearer {token}"}


def _client(http: httpx2.AsyncClient, url: str, timeout_s: float, max_bytes: int) -> Client:
    # an SSE event larger than the result allowed (plus JSON-RPC framing) is refused as it streams in
    transport = streamable_http_client(url, http_client=http, max_sse_event_size=max_bytes + 65_536)
    return Client(transport, read_timeout_seconds=timeout_s, cache=None)


def _http(auth_env: str | None, timeout_s: float) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(headers=_headers(auth_env), timeout=httpx2.Timeout(timeout_s))


async def list_tools(url: str, auth_env: str | None, timeout_s: float) -> list[dict[str, Any]]:
    """The server's tools as OpenAI function definitions (names unqualified); Unreachable when it cannot say."""
    try:
        async with asyncio.timeout(timeout_s), _http(auth_env, timeout_s) as http:
            async with _client(http, url, timeout_s, 1 << 20) as client:
                listed = await client.list_tools()
    except Unreachable:
        raise
    except (TimeoutError, MCPError, httpx2.HTTPError, OSError) as exc:
        raise Unreachable(
            f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        ) from exc
    except Exception as exc:  # the SDK wraps transport failures in exception groups
        raise Unreachable(type(exc).__name__) from exc
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": (tool.description or "")[:1024],
                "parameters": tool.input_schema or {"type": "object", "properties": {}},
            },
        }
        for tool in listed.tools
    ]


def _text(result: Any) -> str:
    parts = []
    for item in result.content:
        text = getattr(item, "text", None)
        parts.append(text if isinstance(text, str) else f"[{item.type} content omitted]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


async def call(server: Mapping[str, Any], tool: str, arguments: str) -> Result:
    """Call one tool of a registered server within its limits; every failure is a Result the model reads."""
    started = time.perf_counter()

    def done(status: str, content: str) -> Result:
        return Result(status, content, round((time.perf_counter() - started) * 1000, 1))

    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        return done("error", "The arguments were not valid JSON.")
    if not isinstance(args, dict):
        return done("error", "The arguments must be a JSON object.")
    timeout_s, max_bytes = float(server["timeout_s"]), int(server["max_result_bytes"])
    try:
        async with asyncio.timeout(timeout_s), _http(server.get("auth_env"), timeout_s) as http:
            async with _client(http, server["url"], timeout_s, max_bytes) as client:
                result = await client.call_tool(tool, args, read_timeout_seconds=timeout_s)
    except TimeoutError:
        return done("timeout", f"The tool did not answer within {timeout_s:g} s.")
    except MCPError as exc:
        if "timed out" in str(exc):
            return done("timeout", f"The tool did not answer within {timeout_s:g} s.")
        return done("error", f"The tool's server refused the call: {exc}"[:500])
    except (Unreachable, httpx2.HTTPError, OSError) as exc:
        log.warning("tool server %s unreachable: %s", server["name"], type(exc).__name__)
        return done("unavailable", "The tool's server could not be reached.")
    except Exception as exc:  # transport failures arrive wrapped in exception groups
        log.warning("tool server %s failed: %r", server["name"], exc)
        return done("unavailable", "The tool's server could not be reached.")
    text = _text(result)
    size = len(text.encode())
    if size > max_bytes:
        return done(
            "too_large",
            f"The tool's result was {size} bytes, over its limit of {max_bytes}; it was not read.",
        )
    if result.is_error:
        return done("error", f"The tool failed: {text}"[:2000])
    return done("ok", text)


class ToolServersView(TopicTable):
    """The registered servers, as every edge replica and inference consumer reads them."""

    def __init__(self, bootstrap: str, namespace: str, reader: str) -> None:
        super().__init__(bootstrap, TOOL_SERVERS, namespace, reader)

    def offered(self, role: str) -> list[dict[str, Any]]:
        """The tools a person with this role may use, qualified, as OpenAI function definitions."""
        return [
            tool
            for name, row in sorted(self.rows().items())
            if role in row["roles"]
            for tool in qualify(name, row)
        ]


def qualify(server: str, row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A server's tools as the model is offered them: each name prefixed with the server's."""
    return [
        {
            "type": "function",
            "function": {**t["function"], "name": qualified(server, t["function"]["name"])},
        }
        for t in json.loads(row["tools"])
    ]
