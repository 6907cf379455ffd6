"""Run the schema registry: `python -m registry` (settings from PARLEY_* environment variables)."""

from __future__ import annotations

import logging

import uvicorn
from pydantic import Field

from registry.app import create_app
from registry.log import SchemaLog
from topics.settings import StackSettings


class RegistrySettings(StackSettings):
    host: str = "127.0.0.1"
    registry_port: int = 8081
    registry_topic: str = Field("_schemas", description="The compacted topic the registry keeps its schemas in.")


def main() -> None:
    settings = RegistrySettings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    schemas = SchemaLog(settings.kafka_bootstrap, settings.registry_topic, settings.layout)
    uvicorn.run(create_app(schemas), host=settings.host, port=settings.registry_port, log_level="warning")


if __name__ == "__main__":
    main()
