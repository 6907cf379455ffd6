"""A local cluster for failover tests: 3 Kafka brokers (KRaft) and 3 Cassandra nodes on 127.0.0.11-13 keeping
3 copies (min ISR 2, LOCAL_QUORUM), the whole pipeline on it with two edge replicas and two consumers per pool.

Runs in its own pytest session after the single-node suite (`make test`), under a fresh namespace and its own
port base; the cluster is stopped at the end.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import Cluster as CqlCluster
from cassandra.cluster import Session
from cassandra.policies import WhiteListRoundRobinPolicy
from confluent_kafka.admin import AdminClient

from api.auth import credential
from infra.stack import Stack
from infra.topology import CLUSTER, Node
from registry import client as registry
from replay.client import ChatClient, Run
from runtime import keys
from runtime.kafka_auth import security
from storage.session import tls
from topics.pipeline import Topic, named

from ..sse import shown

PORT_BASE = int(os.environ.get("PARLEY_CLUSTER_TEST_PORT_BASE", "28000"))


@dataclass
class Cluster:
    stack: Stack

    @property
    def namespace(self) -> str:
        return self.stack.namespace

    def client(self, token: str, replica: int = 0) -> httpx.Client:
        url = f"http://127.0.0.1:{PORT_BASE + 100 * replica}"
        timeout = httpx.Timeout(60, read=90)
        return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout)

    def token(self) -> str:
        return credential(f"u-{uuid.uuid4().hex[:8]}", "pro", 3600)

    def topic(self, topic: Topic) -> str:
        return named(topic, self.namespace)

    def kafka(self, **extra: object) -> dict:
        """A Kafka client's configuration, signed in as the stack's tools (admin) over TLS."""
        return {"bootstrap.servers": CLUSTER.kafka_bootstrap, **security(self.stack.settings), **extra}

    def admin(self) -> AdminClient:
        return AdminClient(self.kafka())

    def cql(self, host: str) -> Session:
        """A session on one Cassandra node alone, signed in as the stack over TLS."""
        settings = self.stack.settings.cassandra
        return CqlCluster(
            [host],
            protocol_version=5,
            load_balancing_policy=WhiteListRoundRobinPolicy([host]),
            auth_provider=PlainTextAuthProvider(settings.username, settings.password),
            ssl_context=tls(settings.ca_file),
        ).connect()

    def broker(self, broker_id: int) -> Node:
        return next(b for b in CLUSTER.brokers(self.stack.state) if b.index == broker_id)

    def cassandra(self, index: int) -> Node:
        return self.stack.topology.cassandra_nodes(self.stack.state)[index - 1]

    def leader(self, topic: str, partition: int) -> int:
        meta = self.admin().list_topics(topic, timeout=10).topics[topic]
        return meta.partitions[partition].leader

    def out_of_sync(self) -> list[str]:
        """The partitions of the stack's topics (and the offsets and schemas) missing a copy from their ISR."""
        topics = self.admin().list_topics(timeout=10).topics
        ours = (f"{self.namespace}.", "__consumer_offsets", "_schemas")
        return [
            f"{name}[{p.id}] isr={p.isrs}"
            for name, t in topics.items()
            if name.startswith(ours)
            for p in t.partitions.values()
            if len(p.isrs) != CLUSTER.copies
        ]

    def in_sync(self) -> bool:
        """Every partition of the stack's topics and of the consumer offsets has all its copies in sync."""
        topics = self.admin().list_topics(timeout=10).topics
        ours = (f"{self.namespace}.", "__consumer_offsets", "_schemas")
        mine = [t for name, t in topics.items() if name.startswith(ours)]
        return bool(mine) and all(
            len(p.isrs) == len(p.replicas) == CLUSTER.copies for t in mine for p in t.partitions.values()
        )

    def stages_alive(self) -> list[str]:
        """The pipeline's processes that are not running."""
        running = self.stack.pids()
        return [s.name for s in self.stack.services() if s.name not in running]


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    # Partition counts are settings: fewer than production's 12 and 32 (still more than the consumers of any
    # group), so the three brokers elect leaders and recover from a kill over fewer partitions.
    os.environ.setdefault("PARLEY_CHAT_PARTITIONS", "4")
    os.environ.setdefault("PARLEY_REPLY_PARTITIONS", "8")
    stack = Stack(
        namespace=f"c{uuid.uuid4().hex[:10]}",
        port_base=PORT_BASE,
        replicas=2,
        stages=1,
        workers={"small": 2, "large": 2},
        topology=CLUSTER,
    )
    CLUSTER.wipe(stack.state)  # an empty cluster: what CI gets, and restarts stay quick
    try:
        stack.up()
        registry.connect(stack.registry_url)
        keyring = keys.start(stack.settings, "api", creates=True)
        yield Cluster(stack)
        if keyring is not None:
            keyring.stop()
    finally:
        stack.stop()
        CLUSTER.wipe(stack.state)


@dataclass
class Stream:
    """One chat turn read to its end as a client would: when the connection breaks or the stream ends without
    `run.completed`, it resumes with Last-Event-ID (on the other edge replica, alternating)."""

    cluster: Cluster
    token: str
    content: str
    max_tokens: int = 160
    events: list[dict] = field(default_factory=list)
    resumes: int = 0
    token_times: list[float] = field(default_factory=list)  # monotonic time each token event arrived
    error: str | None = None

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        return thread

    @property
    def run_id(self) -> str | None:
        return next((e["data"]["run_id"] for e in self.events if "run_id" in e.get("data", {})), None)

    @property
    def completed(self) -> bool:
        return bool(self.events) and self.events[-1]["event"] == "run.completed"

    @property
    def ended(self) -> bool:
        return bool(self.events) and self.events[-1]["event"] in ("run.completed", "error")

    @property
    def text(self) -> str:
        """The answer as a client shows it: the deltas, less what a retraction took back (never stored)."""
        return shown(self.events)

    def _run(self) -> None:
        try:
            client = self.cluster.client(self.token)
            created = client.post("/v1/chats")
            if created.status_code != 201:
                raise AssertionError(f"POST /v1/chats: {created.status_code} {created.text[:300]}")
            self.chat_id = created.json()["id"]
            self._read(lambda: ChatClient(client).send(self.chat_id, self.content, max_tokens=self.max_tokens))
            deadline = time.monotonic() + 240
            while not self.ended and time.monotonic() < deadline:
                self.resumes += 1
                edge = self.cluster.client(self.token, self.resumes % 2)
                cursor = self.events[-1]["id"] if self.events else None
                if self.run_id is None:
                    raise AssertionError("the stream broke before it named its run")
                self._read(lambda edge=edge, run_id=self.run_id: ChatClient(edge).resume(self.chat_id, run_id, cursor))
                if not self.ended:
                    time.sleep(0.5)
        except Exception as exc:  # the test reports it
            self.error = f"{type(exc).__name__}: {exc}"

    def _read(self, read: Callable[[], Run]) -> None:
        """One request's stream (the first, or a resume); a broken one ends early, and is resumed."""
        try:
            run = read()
        except (httpx.ReadTimeout, httpx.ConnectError):
            return
        if run.status != 200:
            raise AssertionError(f"{run.status} {str(run.error)[:300]}")
        self.events += run.events
        self.token_times += run.token_times


def wait_for(fn, timeout_s: float = 60.0, interval_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)


class Traffic:
    """Chat turns started one after another, `concurrency` at a time, each by its own user, until stopped."""

    def __init__(self, cluster: Cluster, concurrency: int = 3, prompt: str = "") -> None:
        self.cluster = cluster
        self.concurrency = concurrency
        self.prompt = prompt or "Write a long story about a lighthouse keeper and a storm at sea."
        self.streams: list[Stream] = []
        self._threads: list[threading.Thread] = []
        self._running = True
        self._driver = threading.Thread(target=self._drive, daemon=True)

    def __enter__(self) -> Traffic:
        self._driver.start()
        return self

    def _drive(self) -> None:
        while self._running:
            if sum(t.is_alive() for t in self._threads) < self.concurrency:
                stream = Stream(self.cluster, self.cluster.token(), self.prompt)
                self.streams.append(stream)
                self._threads.append(stream.start())
            time.sleep(0.2)

    def flowing(self, tokens: int = 3, timeout_s: float = 120.0) -> None:
        """Wait until some stream has received `tokens` tokens."""
        assert wait_for(lambda: any(len(s.token_times) >= tokens for s in self.streams), timeout_s), "no tokens"

    def first_token_after(self, moment: float) -> float | None:
        """Seconds from `moment` to the first token any stream received after it."""
        later = [t for s in self.streams for t in s.token_times if t > moment]
        return min(later) - moment if later else None

    def __exit__(self, *exc: object) -> None:
        self._running = False
        self._driver.join(5)
        for thread in self._threads:
            thread.join(300)
