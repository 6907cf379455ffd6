"""The edge's app factory: a typed lifespan holds the producer, the reply hub and the store clients."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated

import httpx
from confluent_kafka import KafkaError, Message, Producer
from fastapi import Depends, FastAPI, Request

from api import errors
from api.replies import ReplyHub
from api.settings import ApiSettings
from storage.cassandra import Conversations
from topics import tracing
from topics.kafka import producer_config

log = logging.getLogger(__name__)


class EventProducer:
    """confluent-kafka producer with an awaitable, broker-acknowledged send."""

    def __init__(self, bootstrap: str) -> None:
        self._producer = Producer(producer_config(bootstrap))
        self._running = True
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        loop = asyncio.get_running_loop()
        while self._running:
            await loop.run_in_executor(None, self._producer.poll, 0.05)

    async def send(self, topic: str, value: bytes, key: str) -> None:
        loop = asyncio.get_running_loop()
        acked: asyncio.Future[None] = loop.create_future()

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            def settle() -> None:
                if not acked.done():
                    acked.set_result(None) if err is None else acked.set_exception(RuntimeError(str(err)))

            loop.call_soon_threadsafe(settle)

        self._producer.produce(topic, value=value, key=key, headers=tracing.inject(), on_delivery=on_delivery)
        await acked

    async def close(self) -> None:
        self._running = False
        if self._task:
            await self._task
        self._producer.flush(10)


@dataclass
class Services:
    settings: ApiSettings
    producer: EventProducer
    replies: ReplyHub
    conversations: Conversations
    http: httpx.AsyncClient


def services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


Deps = Annotated[Services, Depends(services)]


def create_app(settings: ApiSettings | None = None) -> FastAPI:
    settings = settings or ApiSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tracing.setup("parley-api")
        loop = asyncio.get_running_loop()
        conversations = await loop.run_in_executor(
            None, Conversations.connect, settings.cassandra_hosts, settings.cassandra_port, settings.keyspace_name
        )
        producer = EventProducer(settings.kafka_bootstrap)
        producer.start()
        replies = ReplyHub(settings.kafka_bootstrap, settings.namespace, settings.reply_partition)
        await loop.run_in_executor(None, replies.start, loop)
        http = httpx.AsyncClient(timeout=5.0)
        app.state.services = Services(settings, producer, replies, conversations, http)
        log.info("edge ready on %s:%d, reply partition %d", settings.host, settings.port, settings.reply_partition)
        try:
            yield
        finally:
            await http.aclose()
            replies.stop()
            await producer.close()
            conversations.close()

    app = FastAPI(title="Parley", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    errors.install(app)
    from api.routes import chats, system

    app.include_router(chats.router)
    app.include_router(system.router)
    return app
