"""The registry as a process uses it over HTTP (confluent-kafka's SchemaRegistryClient), shaped for topics.codec."""

from __future__ import annotations

import logging

import httpx
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError

from topics import codec

# The client speaks httpx, or its successor httpx2 where that is installed: a failed connection is either's.
try:
    import httpx2

    TRANSPORT: tuple[type[Exception], ...] = (httpx.TransportError, httpx2.TransportError)
except (
    ImportError
):  # pragma: no cover - httpx2 comes with confluent-kafka's schemaregistry extra today
    TRANSPORT = (httpx.TransportError,)


class HttpRegistry:
    def __init__(self, url: str) -> None:
        self.url = url
        self.client = SchemaRegistryClient({"url": url, "max.retries": 0, "timeout": 5})

    def register(self, subject: str, schema: str) -> int:
        try:
            return self.client.register_schema(subject, Schema(schema, "AVRO"))
        except TRANSPORT as exc:
            raise ConnectionError(f"{self.url}: {exc}") from exc
        except SchemaRegistryError as exc:
            if exc.http_status_code >= 500:
                raise ConnectionError(f"{self.url}: {exc}") from exc
            raise RuntimeError(
                f"the schema registry refused {subject}: {exc.error_message}"
            ) from exc

    def fetch(self, schema_id: int) -> str | None:
        try:
            return self.client.get_schema(schema_id).schema_str
        except TRANSPORT as exc:
            raise ConnectionError(f"{self.url}: {exc}") from exc
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                return None
            raise ConnectionError(f"{self.url}: {exc}") from exc


def connect(url: str) -> codec.Schemas:
    """Point this process's codec at the registry and register every record type now."""
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one line per request otherwise
    schemas = codec.use(codec.Schemas(HttpRegistry(url)))
    schemas.register_all()
    return schemas
