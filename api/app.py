"""The edge's app factory: a typed lifespan holds the producer, the reply hub and the store clients."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, MutableMapping
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from fastapi.telemetry import TelemetryConfig

from admission.limits import LimitsView
from admission.placement import PoolView
from api import errors, openapi
from api.body_limit import BodyLimit
from api.deps import Services
from api.forwarded import Forwarded, Networks
from api.memories import MemoryGuard
from api.oidc import Provider
from api.replies import ReplyHub
from api.retention import sweep_forever
from api.settings import ApiSettings
from conversation import tokens
from registry import client as registry
from runtime import keys as person_keys
from runtime import tracing
from runtime.kafka import AsyncProducer
from runtime.mcp import ToolServersView
from safety.policy import PolicyView
from storage import schema
from storage.api_keys import ApiKeys
from storage.conversations import Conversations
from storage.decisions import SafetyDecisions
from storage.documents import Documents
from storage.idempotency import IdempotencyKeys
from storage.ledger import Ledger
from storage.memories import Memories
from storage.people import People
from storage.preferences import Preferences
from storage.responses import Responses
from storage.retention import Retention
from storage.shares import Shares

log = logging.getLogger(__name__)


def untraced(scope: MutableMapping[str, Any]) -> bool:
    return scope.get("path") in {"/livez", "/readyz", "/metrics"}


def create_app(settings: ApiSettings | None = None) -> FastAPI:
    settings = settings or ApiSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tracing.setup("parley-api")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, registry.connect, settings.schema_registry_url)
        sealing = await loop.run_in_executor(
            None, partial(person_keys.start, settings, "api", creates=True)
        )
        session = await loop.run_in_executor(None, schema.connect, settings.cassandra)
        keyspace = settings.keyspace_name
        conversations = await loop.run_in_executor(None, Conversations, session, keyspace, "api")
        producer = AsyncProducer(settings.kafka_bootstrap, "api", settings.namespace)
        producer.start()
        replies = ReplyHub(
            settings.kafka_bootstrap, settings.namespace, settings.edge_session_timeout_s
        )
        await loop.run_in_executor(None, replies.start, loop)
        http = httpx.AsyncClient(timeout=5.0)
        ledger = await loop.run_in_executor(None, Ledger, session, keyspace, "api")
        limits = LimitsView(settings.kafka_bootstrap, settings.namespace, "api")
        await loop.run_in_executor(None, limits.start)
        pools = PoolView(settings.kafka_bootstrap, settings.namespace, "api")
        await loop.run_in_executor(None, pools.start)
        policies = PolicyView(settings.kafka_bootstrap, settings.namespace, "api")
        await loop.run_in_executor(None, policies.start)
        tool_servers = ToolServersView(settings.kafka_bootstrap, settings.namespace, "api")
        await loop.run_in_executor(None, tool_servers.start)
        for spec in {
            pool.tokenizer for pool in settings.pools.values()
        }:  # the door counts with them (api/runs.py)
            await loop.run_in_executor(None, tokens.load, spec)
        keys = await loop.run_in_executor(None, ApiKeys, session, keyspace, "api")
        decisions = await loop.run_in_executor(None, SafetyDecisions, session, keyspace, "api")
        idempotency = await loop.run_in_executor(None, IdempotencyKeys, session, keyspace, "api")
        people = await loop.run_in_executor(None, People, session, keyspace, "api")
        preferences = await loop.run_in_executor(None, Preferences, session, keyspace, "api")
        shares = await loop.run_in_executor(None, Shares, session, keyspace, "api")
        kept = await loop.run_in_executor(None, Memories, session, keyspace, "api")
        retention = await loop.run_in_executor(None, Retention, session, keyspace, "api")
        stored_responses = await loop.run_in_executor(None, Responses, session, keyspace, "api")
        attached = await loop.run_in_executor(None, Documents, session, keyspace, "api")
        provider = None
        if settings.oidc_issuer:
            provider = Provider(
                settings.oidc_issuer,
                settings.oidc_client_id,
                settings.oidc_client_secret.get_secret_value(),
                settings.oidc_scopes,
                http,
            )
        app.state.services = Services(
            settings,
            producer,
            replies,
            conversations,
            http,
            ledger,
            limits,
            pools,
            policies,
            keys,
            decisions,
            idempotency,
            people,
            preferences,
            shares,
            kept,
            MemoryGuard(policies),
            retention,
            stored_responses,
            attached,
            tool_servers,
            provider,
            sealing,
        )
        sweeper = asyncio.create_task(sweep_forever(app.state.services))
        log.info(
            "edge ready on %s:%d, reply partitions %s",
            settings.host,
            settings.port,
            list(replies.partitions),
        )
        try:
            yield
        finally:
            sweeper.cancel()
            await http.aclose()
            policies.stop()
            tool_servers.stop()
            pools.stop()
            limits.stop()
            replies.stop()
            if sealing is not None:
                sealing.stop()
            await producer.close()
            session.cluster.shutdown()

    # FastAPI's own OpenTelemetry server span per request continues the caller's traceparent (one trace from
    # the user's service through every stage); probes and scrapes are left out, and so are its per-dependency
    # spans (a request is one hop of the run's trace).
    telemetry: TelemetryConfig = {"operation_spans": False, "metrics": False, "exclude": untraced}
    app = FastAPI(title="Parley", version="0.1.0", lifespan=lifespan, telemetry=telemetry)
    app.state.settings = settings
    errors.install(app)
    openapi.install(app, settings)
    # before parsing, before any credential
    app.add_middleware(
        BodyLimit,
        max_bytes=settings.max_body_bytes,
        idle_s=settings.body_idle_timeout_s,
        upload_bytes=settings.document_max_mib * 1024 * 1024 + 256 * 1024,  # and the form around it
    )
    app.add_middleware(  # outermost: who the client is comes first
        Forwarded,
        trusted=Networks(settings.trusted_proxies),
        max_per_client=settings.max_connections_per_client,
    )
    from api.routes import (
        admin,
        chat_runs,
        chats,
        documents,
        embeddings,
        keys,
        local_accounts,
        memories,
        messages,
        openai,
        people,
        preferences,
        responses,
        runs,
        safety,
        search,
        shares,
        signin,
        system,
        tools,
        web,
    )

    for api in (
        chats,
        messages,
        chat_runs,
        documents,
        openai,
        responses,
        embeddings,
        keys,
        system,
        preferences,
        memories,
        search,
        shares,
        admin,
        people,
        safety,
        tools,
        runs,
    ):
        app.include_router(api.router, responses=openapi.ERRORS)
    app.include_router(system.probes)
    app.include_router(web.router)
    app.include_router(signin.router)
    app.include_router(local_accounts.router)
    app.include_router(local_accounts.admin_router, responses=openapi.ERRORS)
    app.mount(
        "/static", StaticFiles(directory=system.STATIC), name="static"
    )  # the dashboard's page and Chart.js
    app.mount(
        "/app", StaticFiles(directory=settings.web_dir, check_dir=False), name="app"
    )  # the chat app's assets
    return app
