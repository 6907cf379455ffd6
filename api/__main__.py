"""Run one edge replica: `python -m api` (settings from PARLEY_* environment variables)."""

from __future__ import annotations

import logging

import uvicorn

from api.app import create_app
from api.server import guarded
from api.settings import ApiSettings


def main() -> None:
    settings = ApiSettings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    protocol = guarded(settings.header_timeout_s, settings.max_connections_per_client)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning", http=protocol)


if __name__ == "__main__":
    main()
