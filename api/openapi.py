"""What the OpenAPI document says beyond the routes' models, declared here and attached by the routes:

- errors: every /v1 operation documents the OpenAI-shaped error body for each status the edge sends (and, by
  declaring a 4XX, no 422: FastAPI's validation errors answer 400 with that body, api/errors.py);
- streams: the SSE routes' events, and the `X-Run-Id` header naming a new run;
- links, so a client (and a fuzzer) can follow a chat's life: a created chat to what can be done with it, a
  sent message to resuming, cancelling, regenerating, editing and rating its answer; a new API key to
  revoking it.

The one thing written into the document after FastAPI builds it is what settings decide at start: a message's
length, max_tokens and the models served (`limits`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from api.schemas import ErrorBody
from api.settings import ApiSettings

STATUSES: dict[int | str, str] = {
    400: "The request is not valid (the message says which field and why).",
    401: "No valid credential.",
    403: "The credential may not do this.",
    404: "No such chat, run or message for this caller.",
    409: "The chat's or run's state does not allow it (a run already ended; `chat_busy`: the chat is still "
    "answering, and `idempotency_key_in_use`: the first request with that key is still opening, both with "
    "`Retry-After`).",
    413: "The body is larger than the edge accepts.",
    429: "Over capacity, over budget, too many runs at once or per minute: retry after `Retry-After` seconds.",
    "4XX": "Another client error (405 on a method the path does not take; `idempotency_key_reused` for a key "
    "sent before with another request).",
    503: "A part the edge needs did not answer in time: retry after `Retry-After` seconds.",
}
ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in STATUSES.items()
}
ENGINE_ERRORS: dict[int | str, dict[str, Any]] = {
    502: {"model": ErrorBody, "description": "The model failed before its first token."},
    504: {"model": ErrorBody, "description": "The run did not answer in time."},
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
        "data": {
            "type": "string",
            "description": "JSON; its fields depend on the event (docs/api.md).",
        },
    },
}
CHUNK_EVENT = {  # one event of the OpenAI route's stream: a chunk, an error, or [DONE]
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}},
}
RESPONSE_EVENT = {  # one event of a Responses stream: its type, and the event as JSON
    "type": "object",
    "required": ["event", "data"],
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
}
CHAT = "/v1/chats/{chat_id}"


def operation(method: str, path: str) -> str:
    """A link's target as a JSON pointer into the document's paths (its braces percent-encoded)."""
    return f"#/paths/{quote(path.replace('~', '~0').replace('/', '~1'), safe='~')}/{method}"


def links(targets: dict[str, tuple[str, str]], **parameters: str) -> dict[str, Any]:
    return {
        name: {"operationRef": operation(method, path), "parameters": parameters}
        for name, (method, path) in targets.items()
    }


CHAT_LINKS = links(  # from a created chat: its id in the body
    {
        "GetChat": ("get", CHAT),
        "RenameChat": ("patch", CHAT),
        "DeleteChat": ("delete", CHAT),
        "ListMessages": ("get", f"{CHAT}/messages"),
        "SendMessage": ("post", f"{CHAT}/messages"),
        "ResetContext": ("post", f"{CHAT}/context/reset"),
        "ShareChat": ("post", f"{CHAT}/share"),
    },
    chat_id="$response.body#/id",
)
SHARE_LINKS = {  # from a made share: its id in the body
    **links({"ReadShare": ("get", "/v1/shared/{share_id}")}, share_id="$response.body#/id"),
    **links(
        {"RevokeShare": ("delete", f"{CHAT}/share/{{share_id}}")},
        chat_id="$request.path.chat_id",
        share_id="$response.body#/id",
    ),
}
RUN = "$response.header.X-Run-Id"  # an answer's id is its run's
RUN_LINKS = {
    **links(
        {
            "ResumeRun": ("get", f"{CHAT}/runs/{{run_id}}/events"),
            "CancelRun": ("post", f"{CHAT}/runs/{{run_id}}/cancel"),
            "Regenerate": ("post", f"{CHAT}/runs/{{run_id}}/regenerate"),
        },
        chat_id="$request.path.chat_id",
        run_id=RUN,
    ),
    **links(
        {
            "RateAnswer": ("post", f"{CHAT}/messages/{{message_id}}/feedback"),
            "EditAnswer": ("patch", f"{CHAT}/messages/{{message_id}}"),
            "DeleteAnswer": ("delete", f"{CHAT}/messages/{{message_id}}"),
        },
        chat_id="$request.path.chat_id",
        message_id=RUN,
    ),
}
KEY_LINKS = links({"RevokeKey": ("delete", "/v1/api-keys/{key_id}")}, key_id="$response.body#/id")
STREAM: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {"schema": CHAT_EVENT}}}
}
NEW_RUN: dict[int | str, dict[str, Any]] = {
    200: {
        **STREAM[200],
        "headers": {"X-Run-Id": {"description": "The new run's id.", "schema": {"type": "string"}}},
        "links": RUN_LINKS,
    }
}
CHUNKS: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {"schema": CHUNK_EVENT}}}
}


RESPONSE_EVENTS: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {"schema": RESPONSE_EVENT}}}
}


def install(app: FastAPI, settings: ApiSettings) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            limits(doc["components"]["schemas"], settings)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def limits(schemas: dict[str, Any], settings: ApiSettings) -> None:
    """The limits the routes enforce from settings, written where the request bodies are described."""
    text = {"maxLength": settings.max_content_chars, "pattern": r"\S"}  # and not only whitespace
    for name in ("NewMessage", "MessagePatch"):
        schemas[name]["properties"]["content"].update(text)
    tokens = (
        ("NewMessage", ["max_tokens"]),
        ("Regenerate", ["max_tokens"]),
        ("Completion", ["max_tokens", "max_completion_tokens"]),
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
