"""The edge's server span: each request continues the trace its caller started (a W3C `traceparent` header),
so an operator follows one chat from the user's own service through the edge, every stage and the engine.

Hand-written (about 30 lines) because opentelemetry-instrumentation-fastapi is not served by the package index
here; it is what this middleware would be replaced by. Health and metrics pages are not traced (probes and
scrapes would drown the traces).
"""

from __future__ import annotations

from typing import Any

from opentelemetry import context, trace

from topics import tracing

UNTRACED = frozenset({"/livez", "/readyz", "/metrics"})
Scope = dict[str, Any]


class TraceRequests:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in UNTRACED:
            await self.app(scope, receive, send)
            return
        headers = [(k.decode("latin-1"), v) for k, v in scope["headers"]]
        token = context.attach(tracing.extract(headers))
        tracer = trace.get_tracer("parley-api")
        try:
            with tracer.start_as_current_span(scope["method"], kind=trace.SpanKind.SERVER) as span:
                span.set_attribute("http.request.method", scope["method"])
                span.set_attribute("url.path", scope["path"])

                async def send_status(message: dict[str, Any]) -> None:
                    if message["type"] == "http.response.start":
                        span.set_attribute("http.response.status_code", message["status"])
                    await send(message)

                await self.app(scope, receive, send_status)
                route = scope.get("route")
                if route is not None:  # the route's template, not the path: span names stay few
                    span.update_name(f"{scope['method']} {route.path}")
                    span.set_attribute("http.route", route.path)
        finally:
            context.detach(token)
