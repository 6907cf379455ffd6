"""The registry's HTTP API: the Confluent-compatible subset Kafka clients use.

POST /subjects/{subject}/versions        {"schema"}  -> {"id"}   (409 when incompatible)
POST /subjects/{subject}                 {"schema"}  -> {"subject", "id", "version", "schema"}
GET  /subjects, /subjects/{subject}/versions, /subjects/{subject}/versions/{version|latest}
GET  /schemas/ids/{id}                               -> {"schema"}
POST /compatibility/subjects/{subject}/versions/{version|latest} {"schema"} -> {"is_compatible", "messages"}
GET|PUT /config, /config/{subject}                   {"compatibility"} -> {"compatibilityLevel"}
GET  /livez, /readyz
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from registry.log import SchemaLog
from registry.store import LEVELS, Incompatible, Invalid, Store, canonical, parse, schema_key

log = logging.getLogger(__name__)


class Failure(Exception):
    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def create_app(schemas: SchemaLog) -> FastAPI:
    store = Store()
    lock = (
        asyncio.Lock()
    )  # one registration at a time in this replica: versions are counted, not guessed

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, schemas.start, store)
        log.info(
            "schema registry ready: %d schemas, %d subjects", len(store.by_id), len(store.versions)
        )
        yield
        await loop.run_in_executor(None, schemas.stop)

    app = FastAPI(title="Parley schema registry", lifespan=lifespan)

    @app.exception_handler(Failure)
    async def failed(request: Request, exc: Failure) -> JSONResponse:
        return JSONResponse(
            {"error_code": exc.code, "message": exc.message}, status_code=exc.status
        )

    async def body_schema(request: Request) -> str:
        try:
            body = await request.json()
            text = canonical(body["schema"])
            if body.get("schemaType", "AVRO") != "AVRO":
                raise Failure(422, 42202, "only AVRO schemas are kept here")
            parse(text)
        except (ValueError, KeyError, TypeError, Invalid) as exc:
            raise Failure(422, 42201, f"Invalid schema: {exc}") from exc
        return text

    def subject_ids(subject: str) -> list[int]:
        if subject not in store.versions:
            raise Failure(404, 40401, f"Subject '{subject}' not found.")
        return store.versions[subject]

    def version_index(subject: str, version: str) -> int:
        ids = subject_ids(subject)
        number = (
            len(ids) if version in ("latest", "-1") else int(version) if version.isdigit() else 0
        )
        if not 1 <= number <= len(ids):
            raise Failure(404, 40402, f"Version {version} not found.")
        return number

    def described(subject: str, number: int) -> dict[str, Any]:
        schema_id = store.versions[subject][number - 1]
        return {
            "subject": subject,
            "version": number,
            "id": schema_id,
            "schema": store.by_id[schema_id],
        }

    @app.get("/livez")
    async def livez() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> dict[str, Any]:
        """Ready once started: the schemas in _schemas were read back before the server began to listen."""
        return {"status": "ok", "schemas": len(store.by_id)}

    @app.post("/subjects/{subject}/versions")
    async def register(subject: str, request: Request) -> dict[str, int]:
        text = await body_schema(request)
        async with lock:
            try:
                schema_id, record = store.registration(subject, text)
            except Incompatible as exc:
                raise Failure(409, 409, f"Schema being registered is incompatible: {exc}") from exc
            if record is not None:
                key = schema_key(record)
                await asyncio.get_running_loop().run_in_executor(None, schemas.write, key, record)
                store.apply(key, record)
                log.info("registered %s version %d as id %d", subject, record["version"], schema_id)
        return {"id": schema_id}

    @app.post("/subjects/{subject}")
    async def lookup(subject: str, request: Request) -> dict[str, Any]:
        text = await body_schema(request)
        subject_ids(subject)
        number = store.version_of(subject, text)
        if number is None:
            raise Failure(404, 40403, "Schema not found")
        return described(subject, number)

    @app.get("/subjects")
    async def subjects() -> list[str]:
        return sorted(store.versions)

    @app.get("/subjects/{subject}/versions")
    async def versions(subject: str) -> list[int]:
        return list(range(1, len(subject_ids(subject)) + 1))

    @app.get("/subjects/{subject}/versions/{version}")
    async def version(subject: str, version: str) -> dict[str, Any]:
        return described(subject, version_index(subject, version))

    @app.get("/schemas/ids/{schema_id}")
    async def by_id(schema_id: int) -> dict[str, Any]:
        if schema_id not in store.by_id:
            raise Failure(404, 40403, f"Schema {schema_id} not found")
        return {"schema": store.by_id[schema_id]}

    @app.post("/compatibility/subjects/{subject}/versions/{version}")
    async def check(subject: str, version: str, request: Request) -> dict[str, Any]:
        text = await body_schema(request)
        if subject not in store.versions:
            return {"is_compatible": True, "messages": []}
        against = store.versions[subject][version_index(subject, version) - 1]
        problems = store.problems(subject, text, [against])
        return {"is_compatible": not problems, "messages": problems}

    @app.get("/config")
    async def global_config() -> dict[str, str]:
        return {"compatibilityLevel": store.level("")}

    @app.get("/config/{subject}")
    async def subject_config(subject: str) -> dict[str, str]:
        return {"compatibilityLevel": store.level(subject)}

    async def set_level(subject: str, request: Request) -> dict[str, str]:
        try:
            level = (await request.json())["compatibility"].upper()
        except (ValueError, KeyError, AttributeError) as exc:
            raise Failure(422, 42203, 'expected {"compatibility": LEVEL}') from exc
        if level not in LEVELS:
            raise Failure(
                422, 42203, f"Invalid compatibility level {level!r}; one of {', '.join(LEVELS)}"
            )
        key, value = (
            {"keytype": "CONFIG", "subject": subject or None},
            {"compatibilityLevel": level},
        )
        await asyncio.get_running_loop().run_in_executor(None, schemas.write, key, value)
        store.apply(key, value)
        return {"compatibility": level}

    @app.put("/config")
    async def put_global(request: Request) -> dict[str, str]:
        return await set_level("", request)

    @app.put("/config/{subject}")
    async def put_subject(subject: str, request: Request) -> dict[str, str]:
        return await set_level(subject, request)

    return app
