"""MCP servers' tools in the app: admins register servers and say which roles may use them; a person lists the
tools offered to them (and picks some for a message, api/tools.py)."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, ConfigDict, Field

from api import structured
from api.audit import TrailDep
from api.auth import Admin, CurrentUser
from api.deps import Deps, ProducerDep
from api.errors import ApiError
from api.oidc import ROLES
from api.routes.admin import publish
from runtime import mcp
from runtime.mcp import ToolServersView
from topics.clock import now_ms
from topics.events import ToolServer
from topics.pipeline import TOOL_SERVERS

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1")


def tool_servers(deps: Deps) -> ToolServersView:
    return deps.tool_servers


ToolServersDep = Annotated[ToolServersView, Depends(tool_servers)]


class ToolServerIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(
        pattern=r"^https?://", max_length=2048, description="its Streamable HTTP endpoint"
    )
    roles: list[str] = Field(
        default_factory=lambda: list(ROLES), description="the roles whose people may use its tools"
    )
    tools: list[str] | None = Field(
        None, max_length=128, description="the tools offered (null: every tool it lists)"
    )
    timeout_s: float = Field(20.0, ge=0.5, le=300, description="the most one call may take")
    max_result_kib: int = Field(64, ge=1, le=4096, description="a larger result is refused whole")
    auth_env: str | None = Field(
        None,
        pattern=r"^[A-Z_][A-Z0-9_]{0,63}$",
        description="the environment variable (on the edge and the inference consumers) holding its bearer token",
    )


class ToolOut(BaseModel):
    name: str = Field(description="as the model calls it: <server>__<tool>")
    server: str
    description: str
    parameters: dict[str, object]


class ToolServerOut(BaseModel):
    name: str
    url: str
    roles: list[str]
    auth_env: str | None
    timeout_s: float
    max_result_kib: int
    tools: list[ToolOut]
    changed_by: str
    changed_at: int


class ToolServerList(BaseModel):
    data: list[ToolServerOut]


class ToolList(BaseModel):
    data: list[ToolOut]


def tool_out(tool: Mapping[str, Any]) -> ToolOut:
    """A tool as offered (qualified, runtime/mcp.py), with the server it is called on."""
    function = tool["function"]
    where = mcp.split(function["name"])
    return ToolOut(
        name=function["name"],
        server=where[0] if where else "",
        description=function.get("description", ""),
        parameters=function.get("parameters") or {},
    )


def tools_of(name: str, row: Mapping[str, Any]) -> list[ToolOut]:
    return [tool_out(t) for t in mcp.qualify(name, row)]


def server_out(row: Mapping[str, Any]) -> ToolServerOut:
    return ToolServerOut(
        name=row["name"],
        url=row["url"],
        roles=list(row["roles"]),
        auth_env=row.get("auth_env"),
        timeout_s=row["timeout_s"],
        max_result_kib=row["max_result_bytes"] // 1024,
        tools=tools_of(row["name"], row),
        changed_by=row["changed_by"],
        changed_at=row["changed_at"],
    )


@router.get("/tools")
async def my_tools(view: ToolServersDep, user: CurrentUser) -> ToolList:
    """The tools offered to you: pick some for a message (`tools` on POST .../messages)."""
    return ToolList(data=[tool_out(t) for t in view.offered(user.role)])


@router.get("/admin/tool-servers")
async def list_servers(view: ToolServersDep, admin: Admin) -> ToolServerList:
    return ToolServerList(data=[server_out(row) for _, row in sorted(view.rows().items())])


@router.put("/admin/tool-servers/{name}")
async def register_server(
    view: ToolServersDep,
    producer: ProducerDep,
    admin: Admin,
    trail: TrailDep,
    name: str,
    body: ToolServerIn,
) -> ToolServerOut:
    """Register an MCP server, or change one: its tools are listed now (it must answer), and offered to the
    roles named. Listing again is registering again."""
    if not mcp.SERVER_NAME.match(name):
        raise ApiError(
            400,
            "A server's name is 1-32 lower-case letters, digits and single dashes.",
            "invalid_value",
            "name",
        )
    bad_roles = [r for r in body.roles if r not in ROLES]
    if bad_roles:
        raise ApiError(400, f"roles must be among {', '.join(ROLES)}.", "invalid_value", "roles")
    try:
        listed = await mcp.list_tools(body.url, body.auth_env, min(body.timeout_s, 15.0))
    except mcp.Unreachable as exc:
        raise ApiError(
            502,
            f"The MCP server at {body.url} could not be reached or did not list its tools ({exc}).",
            "tool_server_unreachable",
            "url",
        ) from None
    names = {t["function"]["name"] for t in listed}
    missing = sorted(set(body.tools or ()) - names)
    if missing:
        raise ApiError(
            400,
            f"The server lists no tool {', '.join(missing)}; it lists {', '.join(sorted(names))}.",
            "invalid_value",
            "tools",
        )
    offered = [t for t in listed if body.tools is None or t["function"]["name"] in body.tools]
    unfit = [
        t["function"]["name"]
        for t in offered
        if not mcp.FUNCTION_NAME.match(mcp.qualified(name, t["function"]["name"]))
    ]
    for tool in offered:  # the first call is decoded under the tool's schema (inference/calls.py)
        try:
            structured.check(
                tool["function"]["parameters"], f"{tool['function']['name']}'s input schema"
            )
        except structured.Unenforceable as exc:
            raise ApiError(
                400, f"{exc} Leave the tool out with `tools`.", "invalid_tool_schema", "tools"
            ) from None
    if unfit:
        raise ApiError(
            400,
            f"Tool names the model cannot call: {', '.join(unfit)} (letters, digits, _ and -, at most 64 "
            "with the server's name); leave them out with `tools`.",
            "invalid_value",
            "tools",
        )
    record: ToolServer = {
        "event_id": str(uuid.uuid4()),
        "name": name,
        "url": body.url,
        "auth_env": body.auth_env,
        "roles": sorted(set(body.roles), key=ROLES.index),
        "tools": json.dumps(offered),
        "timeout_s": body.timeout_s,
        "max_result_bytes": body.max_result_kib * 1024,
        "changed_by": admin.user_id,
        "changed_at": now_ms(),
    }
    chosen = sorted(t["function"]["name"] for t in offered)
    detail = {"url": body.url, "roles": record["roles"], "tools": chosen}
    await trail("tools.register_server", name, detail=detail)
    await publish(producer, view, TOOL_SERVERS, name, record)
    log.info("admin %s registered MCP server %s (%d tools, roles %s)", admin.user_id, name,
             len(offered), ",".join(record["roles"]))  # fmt: skip
    return server_out(record)


@router.delete("/admin/tool-servers/{name}", status_code=204)
async def remove_server(
    view: ToolServersDep, producer: ProducerDep, admin: Admin, trail: TrailDep, name: str
) -> Response:
    """Remove a server: its tools are offered to no one, and a run that still names one is told it is gone."""
    if view.get(name) is None:
        raise ApiError(404, f"No tool server '{name}'.", "tool_server_not_found")
    await trail("tools.remove_server", name)
    await publish(producer, view, TOOL_SERVERS, name, None)
    return Response(status_code=204)
