"""A request-body limit enforced while the body is read: before it is parsed and before any credential is
checked, so an anonymous client cannot make the edge hold or parse more than `max_bytes` (a 100 MB body was
read and parsed before its 401). Our own because FastAPI's `max_body_size` (Starlette's middleware) answers
a plain-text 413, and every error here is OpenAI-shaped. A body that stops arriving for `idle_s` is refused
too (408): a client trickling its body does not hold a request open.
"""

from __future__ import annotations

import asyncio
import re

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import body


class BodyTooLarge(HTTPException):
    """An HTTPException, so that FastAPI passes it on from its body parsing rather than making it a 400;
    api.errors answers it like any other."""

    code = "body_too_large"

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"The request body is larger than {max_bytes} bytes.")


class BodyTimedOut(HTTPException):
    code = "request_timeout"

    def __init__(self, idle_s: float) -> None:
        super().__init__(408, f"The request body stopped arriving for {idle_s:.0f}s.")


# A document uploaded to a chat (api/routes/documents.py) may be larger than any other body.
UPLOAD = re.compile(r"^/v1/chats/[^/]+/documents/?$")


class BodyLimit:
    def __init__(
        self, app: ASGIApp, max_bytes: int, idle_s: float = 30.0, upload_bytes: int = 0
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.idle_s = idle_s
        self.upload_bytes = upload_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        if scope["method"] == "POST" and UPLOAD.match(scope["path"]):
            limit = max(limit, self.upload_bytes)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await self._refuse(scope, receive, send, limit)  # said so up front: not a byte is read
            return
        seen, complete = 0, False

        async def counted() -> Message:  # a chunked body, or one longer than it said
            nonlocal seen, complete
            if (
                complete
            ):  # after the body, receive() waits for the client to leave (a stream's disconnect)
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.idle_s)
            except TimeoutError:
                raise BodyTimedOut(self.idle_s) from None
            seen += len(message.get("body", b""))
            complete = not message.get("more_body", False)
            if seen > limit:
                raise BodyTooLarge(limit)
            return message

        await self.app(scope, counted, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        error = BodyTooLarge(limit)
        await JSONResponse(body(413, error.detail, error.code), 413)(scope, receive, send)
