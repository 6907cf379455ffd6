"""OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}}. Clients never see str(exc)."""

from __future__ import annotations

import logging
import re

from cassandra import OperationTimedOut, RequestExecutionException
from cassandra.cluster import NoHostAvailable
from confluent_kafka import KafkaException
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from runtime.keys import KeysUnavailable
from runtime.outage import Outage

log = logging.getLogger(__name__)
LOG_OUTAGE = Outage(log, "Kafka (the edge's producer)")
STORE_OUTAGE = Outage(log, "Cassandra (the edge's session)")

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.headers = (
            status,
            message,
            code,
            param,
            headers,
        )


def allowed_methods(request: Request, fallback: str) -> str:
    """Every method the request's path takes, from the OpenAPI document (Starlette's 405 names only those of
    the first route it tried); the fallback for paths the document leaves out."""
    matching = [
        (template.count("{"), {method.upper() for method in operations})
        for template, operations in request.app.openapi()["paths"].items()
        if re.fullmatch(re.sub(r"\{[^/]+\}", "[^/]+", template), request.url.path)
    ]
    fewest = min(
        (params for params, _ in matching), default=0
    )  # /v1/chats/export is not /v1/chats/{chat_id}
    methods = set().union(*(found for params, found in matching if params == fewest))
    return ", ".join(sorted(methods)) or fallback


def body(
    status: int, message: str, code: str | None = None, param: str | None = None
) -> dict[str, object]:
    return {
        "error": {
            "message": message,
            "type": TYPES.get(status, "api_error"),
            "param": param,
            "code": code,
        }
    }


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(
            body(exc.status, exc.message, exc.code, exc.param), exc.status, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            return JSONResponse(
                body(400, "The request body is not valid JSON.", "invalid_json"), 400
            )
        message = f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid value')}"
        return JSONResponse(body(400, message, "invalid_value", ".".join(loc) or None), 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        content = body(exc.status_code, str(exc.detail), getattr(exc, "code", None))
        headers = dict(exc.headers or {})
        if (
            exc.status_code == 405
        ):  # every method the path takes (Starlette names only its first route's)
            headers["Allow"] = allowed_methods(request, headers.get("Allow", ""))
        return JSONResponse(content, exc.status_code, headers=headers)

    @app.exception_handler(KafkaException)
    async def log_unavailable(request: Request, exc: KafkaException) -> JSONResponse:
        """The log did not take the record within the producer's delivery timeout (brokers down, or too few
        copies in sync): a clear, retryable error rather than a hang."""
        LOG_OUTAGE.failed(f"{request.method} {request.url.path}: {exc}")
        message = "The event log is unavailable right now; retry shortly."
        return JSONResponse(
            body(503, message, "log_unavailable"), 503, headers={"Retry-After": "5"}
        )

    @app.exception_handler(KeysUnavailable)
    async def keys_unavailable(request: Request, exc: KeysUnavailable) -> JSONResponse:
        """A person's data key could not be made or read (the keys topic out of reach): nothing of theirs was
        written, sealed or not."""
        LOG_OUTAGE.failed(f"{request.method} {request.url.path}: {exc}")
        message = "The data keys are unavailable right now, so nothing was written; retry shortly."
        return JSONResponse(
            body(503, message, "keys_unavailable"), 503, headers={"Retry-After": "5"}
        )

    async def store_unavailable(request: Request, exc: Exception) -> JSONResponse:
        """Too few Cassandra replicas answered in time (nodes down or overloaded): retryable, like the log's."""
        STORE_OUTAGE.failed(f"{request.method} {request.url.path}: {type(exc).__name__}: {exc}")
        message = "The conversation store is unavailable right now; retry shortly."
        return JSONResponse(
            body(503, message, "store_unavailable"), 503, headers={"Retry-After": "5"}
        )

    for kind in (OperationTimedOut, RequestExecutionException, NoHostAvailable):
        app.add_exception_handler(kind, store_unavailable)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(body(500, "Internal error; it has been logged."), 500)
