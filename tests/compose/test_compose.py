"""docker-compose.yml's CPU topology serves a chat, the usage endpoint and the dashboard (tests/compose/topology.py
runs its services as compose would: their commands, environment and healthchecks, service names resolving to
their own addresses)."""

from __future__ import annotations

import base64
import os
import secrets
import time
import uuid

import httpx
import pytest

from api.auth import credential
from api.settings import ApiSettings
from replay.client import ChatClient
from tests.stack.conftest import forget_topics

from .topology import Topology


@pytest.fixture(scope="module")
def compose(stores, tmp_path_factory):
    scratch = tmp_path_factory.mktemp("compose")
    namespace = f"compose{uuid.uuid4().hex[:8]}"  # its own topics, groups and keyspace beside any other stack
    env = {
        name: secrets.token_urlsafe(24)
        for name in ("PARLEY_JWT_SECRET", "PARLEY_INTERNAL_TOKEN", "CLICKHOUSE_PASSWORD")
    }
    env["PARLEY_KEK"] = base64.b64encode(os.urandom(32)).decode()
    env["PARLEY_DEV_TOKENS"] = "true"  # the test signs in with development tokens
    # The ClickHouse server is the one part with no stand-in here: metering stores usage in the embedded engine.
    chdb = {"PARLEY_USAGE_URL": f"chdb://{scratch / 'clickhouse'}", "PARLEY_NAMESPACE": namespace}
    overrides = {"metering": chdb, "migrate": chdb}
    topology = Topology(scratch, env, "cpu", overrides)
    for name in topology.services:
        topology.overrides.setdefault(name, {})["PARLEY_NAMESPACE"] = namespace
    try:
        topology.start()
        yield topology, env
    finally:
        topology.stop()
        forget(namespace)


def forget(namespace: str) -> None:
    """Drop what the topology made in the shared Kafka and Cassandra: its topics and its keyspace."""
    from runtime.settings import StackSettings
    from storage.session import connect_session

    forget_topics(namespace)
    settings = StackSettings(namespace=namespace).cassandra
    session = connect_session(settings)
    try:
        session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=60)
    finally:
        session.cluster.shutdown()


def eventually(read, done, timeout_s: float = 60.0):
    """What `read` returns once `done` holds of it (the sinks store a turn just after its stream ends)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = read()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


def token(env: dict[str, str], user: str, admin: bool = False) -> str:
    return credential(user, "pro", 600, admin, ApiSettings(jwt_secret=env["PARLEY_JWT_SECRET"]))


def test_the_compose_topology_serves_a_chat_its_usage_and_the_dashboard(compose):
    topology, env = compose
    assert {"migrate", "schema-registry", "moderation", "scheduling", "persistence", "memory", "metering"} <= set(
        topology.services
    )
    assert {"llama-small", "llama-large", "inference-cpu-small", "inference-cpu-large", "api"} <= set(topology.services)
    edge = topology.url("api", 8000)
    user = f"u-{uuid.uuid4().hex[:8]}"
    headers = {"Authorization": f"Bearer {token(env, user)}"}
    with httpx.Client(base_url=edge, headers=headers, timeout=120) as client:
        chat = client.post("/v1/chats", json={"title": "compose"})
        assert chat.status_code == 201, chat.text
        chat_id = chat.json()["id"]
        answer = ChatClient(client).send(chat_id, "Say hello in three words.", max_tokens=12)
        assert answer.status == 200, answer.error
        events = answer.events
        kinds = [e["event"] for e in events]
        assert "token" in kinds and kinds[-1] == "run.completed", kinds
        run_id = events[-1]["data"]["run_id"]
        stored = eventually(lambda: client.get(f"/v1/chats/{chat_id}/messages").json()["data"], lambda m: len(m) == 2)
        assert [m["role"] for m in stored] == ["user", "assistant"] and stored[1]["content"]

        # Usage: metering (reached by its service name) stored the run's row; the edge reads it back.
        usage = eventually(lambda: client.get("/v1/usage").json(), lambda u: u.get("runs", 0) >= 1)
        assert usage.get("runs") == 1 and usage["completion_tokens"] > 0, usage

    admin = {"Authorization": f"Bearer {token(env, 'ops', admin=True)}"}
    page = httpx.get(f"{edge}/dashboard", timeout=30)
    assert page.status_code == 200 and "<html" in page.text.lower()
    report = httpx.get(f"{edge}/v1/usage/report", headers=admin, params={"user_id": user}, timeout=30)
    assert report.status_code == 200, report.text
    assert run_id and report.json()["totals"]["runs"] == 1, report.json()
