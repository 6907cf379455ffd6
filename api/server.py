"""The edge's HTTP server: uvicorn's h11 protocol with the two guards it lacks.

- A request's head (request line and headers) must arrive within `header_timeout_s` of the connection
  opening, or of the previous response on a kept-alive connection. uvicorn cancels its keep-alive timer on
  the first byte and has no other, so 100 clients sending headers a byte at a time held 100 connections
  indefinitely. A late head is answered 408 and the connection closed.
- One client address holds at most `max_connections_per_client` connections at once; one more is answered
  429 with Retry-After and closed, so one client cannot take every socket and worker from the others. A
  trusted proxy's connections (`trusted_proxies`) carry many clients: they are not counted here, and each
  client behind the proxy is limited by its forwarded address instead (api/forwarded.py).

Hand-written because uvicorn offers neither (only a server-wide `limit_concurrency`, which refuses everyone
once one client has filled it), and the body's own timeout and size limit live in api/body_limit.py.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from api.errors import body
from api.forwarded import Networks


def raw_error(
    status: int, reason: str, message: str, code: str, retry_after: int | None = None
) -> bytes:
    """A whole HTTP/1.1 response, written before (or instead of) reading a request."""
    content = json.dumps(body(status, message, code)).encode()
    head = [
        f"HTTP/1.1 {status} {reason}",
        "content-type: application/json",
        f"content-length: {len(content)}",
        "connection: close",
    ]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + content


class GuardedH11(H11Protocol):
    header_timeout_s = 10.0
    max_connections_per_client = 64
    trusted: Networks = Networks(())
    open_by_client: Counter[str] = Counter()  # one server per process: the count is the process's

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._address = self.client[0] if self.client else ""
        self._head_timer: asyncio.TimerHandle | None = None
        self._counted = self._address not in self.trusted  # a proxy's clients: by forwarded address
        if not self._counted:
            self._arm()
            return
        self.open_by_client[self._address] += 1
        if self.open_by_client[self._address] > self.max_connections_per_client:
            message = (
                f"More than {self.max_connections_per_client} connections from one client at once."
            )
            transport.write(raw_error(429, "Too Many Requests", message, "too_many_connections", 1))
            transport.close()
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if not self._counted:
            super().connection_lost(exc)
            return
        self.open_by_client[self._address] -= 1
        if self.open_by_client[self._address] <= 0:
            del self.open_by_client[self._address]
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the head is in: the body has its own timeout
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm()  # the next request's head, on a kept-alive connection

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        message = f"The request's headers did not arrive within {self.header_timeout_s:.0f}s."
        self.transport.write(raw_error(408, "Request Timeout", message, "request_timeout"))
        self.transport.close()


def guarded(
    header_timeout_s: float, max_connections_per_client: int, trusted: Networks
) -> type[Any]:
    """The protocol class with this edge's limits (uvicorn instantiates it per connection)."""
    return type(
        "GuardedH11",
        (GuardedH11,),
        {
            "header_timeout_s": header_timeout_s,
            "max_connections_per_client": max_connections_per_client,
            "trusted": trusted,
        },
    )
