"""The OpenAPI document as the edge really behaves: FastAPI's own, then

- errors: every operation documents the OpenAI-shaped error body (FastAPI documents a 422 validation error
  the edge never sends: it answers 400 with that body);
- limits that come from settings: a message's length, max_tokens, the models served;
- streams: the SSE routes say text/event-stream, and a new run's response names the run (`X-Run-Id`);
- links, so a client (and a fuzzer) can follow a chat's life: a created chat to what can be done with it, a
  sent message to resuming, cancelling, regenerating, editing and rating its answer; a new API key to
  revoking it.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from api.settings import ApiSettings

ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
EVENTS = [
    "run.accepted",
    "run.queued",
    "run.started",
    "token",
    "moderation",
    "run.completed",
    "error",
]
CHAT_EVENT = {  # one event of a chat run's stream
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"type": "string", "enum": EVENTS},
        "id": {
            "type": "string",
            "description": "The record's position in the log: a resume's Last-Event-ID.",
        },
        "data": {"type": "string", "description": "JSON; its fields depend on the event (README)."},
    },
}
CHUNK_EVENT = {  # one event of the OpenAI route's stream: a chunk, an error, or [DONE]
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}},
}
ERRORS = {
    "400": "The request is not valid (the message says which field and why).",
    "401": "No valid credential.",
    "403": "The credential may not do this.",
    "404": "No such chat, run or message for this caller.",
    "409": "The run's state does not allow it.",
    "413": "The body is larger than the edge accepts.",
    "429": "Over capacity, over budget or too many runs at once: retry after `Retry-After` seconds.",
    "503": "A part the edge needs did not answer in time: retry after `Retry-After` seconds.",
}
STREAMS = (
    ("post", "/v1/chats/{chat_id}/messages"),
    ("post", "/v1/chats/{chat_id}/runs/{run_id}/regenerate"),
    ("get", "/v1/chats/{chat_id}/runs/{run_id}/events"),
)
NEW_RUN = STREAMS[:2]
TOKEN_FIELDS = ["max_tokens", "max_completion_tokens"]
CHAT = "/v1/chats/{chat_id}"
FROM_CHAT = {  # link name: (method, path) taking the new chat's id
    "GetChat": ("get", CHAT),
    "RenameChat": ("patch", CHAT),
    "DeleteChat": ("delete", CHAT),
    "ListMessages": ("get", f"{CHAT}/messages"),
    "SendMessage": ("post", f"{CHAT}/messages"),
    "ResetContext": ("post", f"{CHAT}/context/reset"),
}
FROM_RUN = {  # link name: (method, path, the path parameter that takes the run id)
    "ResumeRun": ("get", f"{CHAT}/runs/{{run_id}}/events", "run_id"),
    "CancelRun": ("post", f"{CHAT}/runs/{{run_id}}/cancel", "run_id"),
    "Regenerate": ("post", f"{CHAT}/runs/{{run_id}}/regenerate", "run_id"),
    "RateAnswer": (
        "post",
        f"{CHAT}/messages/{{message_id}}/feedback",
        "message_id",
    ),  # an answer's id is its run's
    "EditAnswer": ("patch", f"{CHAT}/messages/{{message_id}}", "message_id"),
    "DeleteAnswer": ("delete", f"{CHAT}/messages/{{message_id}}", "message_id"),
}


def install(app: FastAPI, settings: ApiSettings) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            app.openapi_schema = document(doc, settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def document(doc: dict[str, Any], settings: ApiSettings) -> dict[str, Any]:
    """FastAPI's document made true to the edge (pure: changes and returns `doc`)."""
    paths, schemas = doc["paths"], doc.setdefault("components", {}).setdefault("schemas", {})
    schemas["Error"] = ERROR
    for schema in ("HTTPValidationError", "ValidationError"):
        schemas.pop(schema, None)
    for path, operations in paths.items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            for status, description in ERRORS.items() if path.startswith("/v1/") else ():
                responses.setdefault(
                    status, {"description": description, "content": json_of("Error")}
                )
    health = paths["/readyz"]["get"]["responses"]
    health["503"] = {
        "description": "No reply partition held yet (a standby, or its group is rebalancing).",
        "content": json_of(None),
    }
    for method, path in STREAMS:
        ok = paths[path][method]["responses"]["200"]
        ok["content"] = {"text/event-stream": {"schema": CHAT_EVENT}}
    for method, path in NEW_RUN:
        ok = paths[path][method]["responses"]["200"]
        ok["headers"] = {
            "X-Run-Id": {"description": "The new run's id.", "schema": {"type": "string"}}
        }
        ok["links"] = {
            name: {
                "operationId": paths[target][how]["operationId"],
                "parameters": {
                    "chat_id": "$request.path.chat_id",
                    param: "$response.header.X-Run-Id",
                },
            }
            for name, (how, target, param) in FROM_RUN.items()
        }
    created = paths["/v1/chats"]["post"]["responses"]["201"]
    created["links"] = {
        name: {
            "operationId": paths[target][how]["operationId"],
            "parameters": {"chat_id": "$response.body#/id"},
        }
        for name, (how, target) in FROM_CHAT.items()
    }
    revoke = paths["/v1/api-keys/{key_id}"]["delete"]["operationId"]
    key = paths["/v1/api-keys"]["post"]["responses"]["201"]
    key["links"] = {
        "RevokeKey": {"operationId": revoke, "parameters": {"key_id": "$response.body#/id"}}
    }
    completions = paths["/v1/chat/completions"]["post"]["responses"]["200"]
    completions["content"] = {**json_of(None), "text/event-stream": {"schema": CHUNK_EVENT}}
    limits(schemas, settings)
    return doc


def json_of(schema: str | None) -> dict[str, Any]:
    return {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"} if schema else {}}
    }


def limits(schemas: dict[str, Any], settings: ApiSettings) -> None:
    """The limits the routes enforce from settings, written where the request bodies are described."""
    text = {"maxLength": settings.max_content_chars, "pattern": r"\S"}  # and not only whitespace
    for name in ("NewMessage", "MessagePatch"):
        schemas[name]["properties"]["content"].update(text)
    tokens = (
        ("NewMessage", ["max_tokens"]),
        ("Regenerate", ["max_tokens"]),
        ("Completion", TOKEN_FIELDS),
    )
    for name, fields in tokens:
        for field in fields:
            branch(schemas[name]["properties"][field], "integer")["maximum"] = (
                settings.max_tokens_limit
            )
    for name in ("NewMessage", "Regenerate", "Completion"):
        branch(schemas[name]["properties"]["model"], "string")["enum"] = list(settings.models)


def branch(prop: dict[str, Any], kind: str) -> dict[str, Any]:
    """The part of a property's schema of one type (FastAPI writes `x: int | None` as anyOf)."""
    options: list[dict[str, Any]] = prop.get("anyOf", [prop])
    for option in options:
        if option.get("type") == kind:
            return option
    raise KeyError(kind)
