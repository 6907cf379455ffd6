"""Run the schema registry: `python -m registry` (settings from PARLEY_* environment variables)."""

from __future__ import annotations

import uvicorn
from pydantic import Field

from registry.app import create_app
from registry.log import SchemaLog
from runtime import logs
from runtime.settings import StackSettings


class RegistrySettings(StackSettings):
    registry_port: int = 8081
    registry_topic: str = Field(
        "_schemas", description="The compacted topic the registry keeps its schemas in."
    )


def main() -> None:
    settings = RegistrySettings()
    logs.configure(settings.log_level, settings.log_format)
    schemas = SchemaLog(settings.kafka_bootstrap, settings.registry_topic, settings.layout)
    uvicorn.run(
        create_app(schemas), host=settings.host, port=settings.registry_port, log_level="warning"
    )


if __name__ == "__main__":
    main()
