"""The client behind a trusted proxy: an ingress or a company proxy connects for many people, so its own
address says nothing about who is asking.

For a request whose connection comes from `trusted_proxies` (addresses or CIDR networks), the client is the
address the proxy forwarded: uvicorn's ProxyHeadersMiddleware resolves it from X-Forwarded-For (the nearest
address that is not itself a trusted proxy; X-Forwarded-Proto sets the scheme). Such a request is then limited
by that address, as api/server.py limits a direct client by its connections: at most `max_per_client` requests
open at once (a stream is open until it ends), one more answered 429 too_many_connections with Retry-After.
Forwarded headers from anyone else are ignored: a client cannot pose as another by sending them.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Iterable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from api.errors import body


class Networks:
    """Addresses and networks, `address in networks` for an address string (False for one that is not an IP)."""

    def __init__(self, specs: Iterable[str]) -> None:
        self.specs = tuple(specs)
        self.networks = tuple(ipaddress.ip_network(s.strip(), strict=False) for s in self.specs)

    def __contains__(self, address: object) -> bool:
        if not self.networks or not isinstance(address, str):
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self.networks)


class Forwarded:
    """ASGI middleware: the forwarded client of a trusted proxy's request, and its limit."""

    def __init__(self, app: ASGIApp, trusted: Networks, max_per_client: int) -> None:
        self.trusted, self.max_per_client = trusted, max_per_client
        self.open: Counter[str] = Counter()
        self.app = app
        self.resolving = ProxyHeadersMiddleware(self._limited, list(trusted.specs))  # type: ignore[arg-type]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        if scope["type"] != "http" or not client or client[0] not in self.trusted:
            await self.app(scope, receive, send)
            return
        await self.resolving(scope, receive, send)  # type: ignore[arg-type]

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        address = scope["client"][0]
        if self.open[address] >= self.max_per_client:
            message = f"More than {self.max_per_client} requests from one client at once."
            refused = JSONResponse(
                body(429, message, "too_many_connections"), 429, headers={"Retry-After": "1"}
            )
            await refused(scope, receive, send)
            return
        self.open[address] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.open[address] -= 1
            if self.open[address] <= 0:
                del self.open[address]
