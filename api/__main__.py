"""Run one edge replica: `python -m api` (settings from PARLEY_* environment variables)."""

from __future__ import annotations

import uvicorn

from api.app import create_app
from api.forwarded import Networks
from api.server import guarded
from api.settings import ApiSettings
from runtime import logs


def main() -> None:
    settings = ApiSettings()
    logs.configure(settings.log_level, settings.log_format)
    trusted = Networks(settings.trusted_proxies)
    protocol = guarded(settings.header_timeout_s, settings.max_connections_per_client, trusted)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        http=protocol,
        proxy_headers=False,  # api/forwarded.py reads them, from trusted proxies only
    )


if __name__ == "__main__":
    main()
