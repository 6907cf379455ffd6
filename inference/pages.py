"""An inference consumer's own pages: /metrics for the scraper, and /engine/metrics, the engine's own page (the
engine listens on its pod's loopback only); /livez (the event loop answers) and /readyz (the engine is healthy
and this consumer is in its pool's group, so it takes work: 503 while it is out) for probes."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from inference.engine import Engine
from inference.settings import InferenceSettings


async def serve_pages(
    settings: InferenceSettings, engine: Engine, status: Callable[[], dict[str, object]]
) -> web.AppRunner:
    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), content_type=CONTENT_TYPE_LATEST.split(";")[0])

    async def engine_metrics(_request: web.Request) -> web.Response:
        page = await engine.metrics()
        if page is None:
            return web.Response(status=503, text="the engine serves no metrics\n")
        return web.Response(body=page, content_type="text/plain")

    async def livez(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "pool": settings.pool})

    async def readyz(_request: web.Request) -> web.Response:
        body = status()
        return web.json_response(body, status=200 if body["status"] == "ok" else 503)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/engine/metrics", engine_metrics)
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, settings.host, settings.metrics_port).start()
    return runner
