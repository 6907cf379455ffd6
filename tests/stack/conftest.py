"""The real local stack for integration tests: Kafka, Cassandra, chdb and llama-server, every stage a process.

The session runs its own stack under a fresh namespace (topics, consumer groups, keyspace, chdb folder)
and port base, so it never touches a `make up` stack or another run's data.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition

from api.auth import credential
from infra.processes import LOCAL
from infra.stack import Stack
from registry import client as registry
from replay.client import ChatClient
from runtime import keys
from runtime.kafka import delete_topics
from topics.pipeline import Topic, named

PORT_BASE = int(os.environ.get("PARLEY_TEST_PORT_BASE", "18000"))
BOOTSTRAP = "127.0.0.1:9092"
KEYCLOAK = "http://127.0.0.1:8180"
# How often the suite's edges check a browser session again at the provider (production: 120 s): the bound
# tests/stack/test_signin.py holds a person disabled at Keycloak to.
SESSION_CHECK_S = 3


@dataclass
class Live:
    stack: Stack
    url: str
    keycloak: subprocess.Popen[bytes] | None = None  # its start, when this session started it

    def identity_provider(self) -> str:
        """The local Keycloak's address, once it answers."""
        if self.keycloak is not None:
            assert self.keycloak.wait(timeout=240) == 0, "keycloak did not start (infra/local/keycloak.sh logs)"
        return KEYCLOAK

    @property
    def namespace(self) -> str:
        return self.stack.namespace

    def token(self, user: str | None = None, tier: str = "pro", ttl: int = 3600, admin: bool = False) -> str:
        return credential(user or f"u-{uuid.uuid4().hex[:8]}", tier, ttl, admin)

    def client(self, token: str | None = None, replica: int = 0) -> httpx.Client:
        """A client of one edge replica (replica 1 listens on port base + 100, with its own reply partition)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        url = self.url if replica == 0 else f"http://127.0.0.1:{PORT_BASE + 100 * replica}"
        return httpx.Client(base_url=url, headers=headers, timeout=120)

    def chats(self, token: str | None = None, replica: int = 0) -> ChatClient:
        """The chat client (replay/client.py) of one edge replica."""
        return ChatClient(self.client(token, replica))

    def internal(self) -> httpx.Client:
        """A client of the metering stage's internal pages, with the stack's internal token."""
        headers = self.stack.settings.internal_headers()
        return httpx.Client(base_url=self.stage_url("metering"), headers=headers, timeout=30)

    def usage_rows(self, run_id: str) -> list[dict]:
        """The usage rows the metering stage stored for a run."""
        with self.internal() as metering:
            return list(metering.get(f"/usage-rows/{run_id}").json()["data"])

    def stage_url(self, stage: str) -> str:
        offset = {"moderation": 10, "scheduling": 11, "persistence": 12, "metering": 13, "inference": 20}[stage]
        return f"http://127.0.0.1:{PORT_BASE + offset}"

    def worker(self, name: str) -> tuple[str, int]:
        """(metrics URL, pid) of one inference consumer, e.g. "inference-small-1"."""
        service = next(s for s in self.stack.services() if s.name == name)
        return f"http://127.0.0.1:{service.port}/metrics", self.stack.pids().get(name, 0)

    def topic(self, topic: Topic) -> str:
        return named(topic, self.namespace)

    @property
    def faults(self) -> Path:
        """Crash points: a file named after one makes the stage that reaches it exit there (PARLEY_FAULTS_DIR)."""
        return Path(os.environ["PARLEY_FAULTS_DIR"])


def _running(script: str) -> bool:
    return subprocess.run(["bash", str(LOCAL / script), "status"], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def live() -> Iterator[Live]:
    started_here = [s for s in ("kafka.sh", "cassandra.sh") if not _running(s)]
    # The identity provider starts beside the stack (its JVM is up in ~25 s); the edges discover it at the first
    # sign-in, and only tests/stack/test_signin.py waits for it (the `keycloak` fixture).
    keycloak = None
    if not _running("keycloak.sh"):
        keycloak = subprocess.Popen(["bash", str(LOCAL / "keycloak.sh"), "start"], stdout=subprocess.DEVNULL)
    os.environ.setdefault("PARLEY_OIDC_ISSUER", f"{KEYCLOAK}/realms/parley")
    os.environ.setdefault("PARLEY_OIDC_CLIENT_SECRET", "parley-local-client-secret")  # the local realm's
    os.environ.setdefault("PARLEY_SESSION_CHECK_S", str(SESSION_CHECK_S))
    os.environ.setdefault("PARLEY_LOCAL_ACCOUNTS", "true")  # beside the provider (off by default when one is set)
    # Two edge replicas and two of each processor stage (metering: one, chdb is single-process); two consumers
    # (two engines) in the small pool so one can die, one in the large pool.
    namespace = f"t{uuid.uuid4().hex[:10]}"
    faults = Path(tempfile.mkdtemp(prefix=f"parley-faults-{namespace}-"))
    os.environ["PARLEY_FAULTS_DIR"] = str(faults)  # the stages inherit it (processors/stage.Stage.crash_point)
    # Partition counts are settings: the suite's stack runs with fewer than production's 12 and 32 (still more
    # than its replicas of anything), so a broker killed mid-burst recovers, and groups rebalance, sooner.
    os.environ.setdefault("PARLEY_CHAT_PARTITIONS", "4")
    os.environ.setdefault("PARLEY_REPLY_PARTITIONS", "8")
    # A client connecting from 127.0.0.2 is a trusted proxy to the suite's edges (tests/stack/test_proxy.py);
    # from 127.0.0.1, as every other test connects, forwarded headers are ignored and each address is limited.
    os.environ.setdefault("PARLEY_TRUSTED_PROXIES", "127.0.0.2")
    os.environ.setdefault("PARLEY_MAX_STREAMS_PER_PERSON", "80")  # tests/stack/test_proxy.py holds 81
    stack = Stack(namespace=namespace, port_base=PORT_BASE, replicas=2, stages=2, workers={"small": 2, "large": 1})
    try:
        stack.up()
    except BaseException:
        stack.stop()  # what had started, so a failed start leaves no process on the suite's ports
        raise
    registry.connect(stack.registry_url)  # the tests decode what the stages wrote
    keyring = keys.start(stack.settings, "api", creates=True)  # through people's keys, as the edge does
    try:
        yield Live(stack, stack.api_url, keycloak)
    finally:
        if keyring is not None:
            keyring.stop()
        stack.stop()
        forget_topics(namespace)  # a broker holding every past run's topics restarts slowly after a kill -9
        if keycloak is not None:
            keycloak.wait()
            started_here.append("keycloak.sh")
        for script in started_here:  # leave a `make up` stack as we found it, stop what we started
            subprocess.run(["bash", str(LOCAL / script), "stop"], check=False)


def forget_topics(namespace: str) -> None:
    try:
        delete_topics(BOOTSTRAP, namespace)
    except Exception as exc:  # the broker may be gone already: the topics stay, as before
        print(f"could not delete the topics of {namespace}: {exc}")


def chat_turn(client: httpx.Client, chat_id: str, content: str, max_tokens: int = 24) -> list[dict]:
    """One turn read to its end: its SSE events."""
    run = ChatClient(client).send(chat_id, content, max_tokens=max_tokens)
    assert run.status == 200, run.error
    return run.events


def parley(live, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The real CLI (`python -m infra.cli`) against this session's stack."""
    argv = [sys.executable, "-m", "infra.cli", *args, "--namespace", live.namespace, "--port-base", str(PORT_BASE)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def read_topic(name: str, match, timeout_s: float = 20.0, partitions: int | None = None) -> list:
    """Every record of a topic (from the start) whose decoded value satisfies match(msg)."""
    consumer = Consumer(
        {"bootstrap.servers": BOOTSTRAP, "group.id": f"test-{uuid.uuid4().hex}", "enable.auto.commit": False}
    )
    meta = consumer.list_topics(name, timeout=10).topics[name]
    tps = [TopicPartition(name, p, 0) for p in (range(partitions) if partitions else meta.partitions)]
    consumer.assign(tps)
    ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in tps}
    found, deadline = [], time.monotonic() + timeout_s
    positions = {p: 0 for p in ends}
    while time.monotonic() < deadline and any(positions[p] < ends[p] for p in ends):
        msg = consumer.poll(0.5)
        if msg is None or msg.error():
            continue
        positions[msg.partition()] = msg.offset() + 1
        if match(msg):
            found.append(msg)
    consumer.close()
    return found


def for_run(schema: str, run_id: str):
    """A read_topic matcher: records of one run (records that do not decode, e.g. poison tests, never match)."""
    from topics import codec
    from topics.errors import PoisonEvent

    def match(msg) -> bool:
        try:
            record = codec.decode(schema, msg.value())
        except PoisonEvent:
            return False
        return (record.get("run_id") or record["prompt"]["run_id"]) == run_id

    return match


CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]


@pytest.fixture(scope="module")
def chromium():
    """Headless Chromium from Debian's package (infra/local/chromium.sh), driven by Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def wait_for(fn, timeout_s: float = 30.0, interval_s: float = 0.25):
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            return value
        time.sleep(interval_s)
