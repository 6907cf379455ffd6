"""Unit tests encode and decode events with the registry's own rules kept in memory (registry.store.InProcess):
the same ids and compatibility checks as the service, without one. `edge`: the edge's app on in-memory stores
(tests/unit/edge_fakes.py), for the route tests."""

from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from api import deps
from api.app import create_app
from api.auth import credential
from api.settings import ApiSettings
from registry.store import InProcess
from topics import codec

from .edge_fakes import (
    FakeChats,
    FakeDocuments,
    FakeIdempotencyKeys,
    FakeKeys,
    FakeMemories,
    FakeMemoryGuard,
    FakePeople,
    FakePolicies,
    FakePreferences,
    FakeProducer,
    FakeShares,
)
from .fakes import FakeLimits


@pytest.fixture(autouse=True, scope="session")
def schema_registry():
    return codec.use(codec.Schemas(InProcess()))


@pytest.fixture
def edge():
    settings = ApiSettings(dev_tokens=True)
    app = create_app(settings)
    chats, keys, producer = FakeChats(), FakeKeys(), FakeProducer()
    app.dependency_overrides[deps.conversations] = lambda: chats
    idempotency = FakeIdempotencyKeys()
    app.dependency_overrides[deps.idempotency] = lambda: idempotency
    app.dependency_overrides[deps.keys] = lambda: keys
    app.dependency_overrides[deps.producer] = lambda: producer
    people = FakePeople()  # browser sessions themselves: tests/stack/test_signin.py
    app.dependency_overrides[deps.people] = lambda: people
    app.dependency_overrides[deps.provider] = lambda: None
    preferences, limits = FakePreferences(), FakeLimits()
    app.dependency_overrides[deps.preferences] = lambda: preferences
    app.dependency_overrides[deps.limits] = lambda: limits
    shares, memories, guard = FakeShares(), FakeMemories(), FakeMemoryGuard()
    app.dependency_overrides[deps.shares] = lambda: shares
    app.dependency_overrides[deps.memories] = lambda: memories
    app.dependency_overrides[deps.memory_guard] = lambda: guard
    documents, policies = FakeDocuments(), FakePolicies()
    app.dependency_overrides[deps.documents] = lambda: documents
    app.dependency_overrides[deps.policies] = lambda: policies
    client = TestClient(app, raise_server_exceptions=False)  # no lifespan: nothing to connect to

    def signed(user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {credential(user, settings=settings)}"}

    return SimpleNamespace(
        app=app,
        http=client,
        chats=chats,
        keys=keys,
        producer=producer,
        people=people,
        preferences=preferences,
        limits=limits,
        shares=shares,
        memories=memories,
        memory_guard=guard,
        documents=documents,
        policies=policies,
        signed=signed,
    )
