"""Where a local stack's Kafka brokers and Cassandra nodes run: one of each (the default, one copy of every
record) or a cluster of three on 127.0.0.11-13 keeping three copies (`parley up --cluster`;
docs/decisions/0011-replicated-data-plane.md)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from infra import certs, kafka_acls
from infra.certs import Secured
from infra.processes import LOCAL, each, sh
from runtime.settings import state_dir


@dataclass(frozen=True)
class Node:
    """One Kafka broker or Cassandra node, run by its infra/local script with `env`."""

    role: str  # kafka-broker | cassandra-node
    index: int  # 1, 2, ...: the broker's node id
    host: str
    port: int
    env: dict[str, str]

    @property
    def name(self) -> str:
        return f"{'kafka' if self.role == 'kafka-broker' else 'cassandra'}-{self.index}"

    @property
    def script(self) -> Path:
        return LOCAL / ("kafka.sh" if self.role == "kafka-broker" else "cassandra.sh")

    def sh(self, *args: str) -> None:
        sh(self.script, *args, env=self.env)

    def pid(self) -> int | None:
        found = subprocess.run(
            ["bash", str(self.script), "pid"],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
        ).stdout.strip()
        return int(found) if found.isdigit() else None


@dataclass(frozen=True)
class Topology:
    """Where a stack's Kafka brokers and Cassandra nodes run (one of each per loopback address) and so how many
    copies of every record they keep: every topic and the keyspace get one copy per address, a write needs a
    majority of them (min.insync.replicas, LOCAL_QUORUM)."""

    hosts: tuple[str, ...] = ("127.0.0.1",)
    folder: str = ""  # under the state folder; "" keeps the single node's kafka/ and cassandra/
    secured: bool = (
        False  # clients sign in and speak TLS (infra/certs.py: the files, in <folder>/secrets)
    )

    def secrets(self, state: Path | None = None) -> Secured | None:
        """The certificates and passwords of a secured topology, made once (None: an open one)."""
        if not self.secured:
            return None
        return certs.ensure((state or state_dir()) / self.folder / "secrets", self.hosts)

    @property
    def copies(self) -> int:
        return len(self.hosts)

    @property
    def majority(self) -> int:
        return self.copies // 2 + 1

    @property
    def kafka_bootstrap(self) -> str:
        return ",".join(f"{host}:9092" for host in self.hosts)

    def settings(self, state: Path | None = None) -> dict[str, object]:
        """The settings (runtime/settings.py StackSettings) of every process on this topology."""
        found: dict[str, object] = {
            "kafka_bootstrap": self.kafka_bootstrap,
            "kafka_replication_factor": self.copies,
            "kafka_min_insync_replicas": self.majority,
            "cassandra_hosts": ",".join(self.hosts),
            "cassandra_replication": {"datacenter1": self.copies},
        }
        secured = self.secrets(state)
        if secured is not None:
            found |= {
                "cassandra_username": CASSANDRA_ROLE,
                "cassandra_password": SecretStr(secured.password("cassandra")),
                "cassandra_ca_file": str(secured.ca),
                "kafka_username": "admin",  # the stack's tools; each process signs in as its stage
                "kafka_password": SecretStr(secured.password("kafka-admin")),
                "kafka_ca_file": str(secured.ca),
            }
        return found

    def signin(self, service: str, state: Path | None = None) -> dict[str, str]:
        """A local stack process's own Kafka user on a secured topology (infra/kafka_acls.py); none otherwise."""
        secured = self.secrets(state)
        if secured is None or service == "otelcol":
            return {}
        user = kafka_acls.user_of(service)
        return {
            "PARLEY_KAFKA_USERNAME": user,
            "PARLEY_KAFKA_PASSWORD": secured.password(f"kafka-{user}"),
        }

    def env(self, state: Path | None = None) -> dict[str, str]:
        return {f"PARLEY_{k.upper()}": _text(v) for k, v in self.settings(state).items()}

    def brokers(self, state: Path) -> list[Node]:
        if not self.folder:
            return [Node("kafka-broker", 1, self.hosts[0], 9092, {})]
        voters = ",".join(f"{i}@{host}:9093" for i, host in enumerate(self.hosts, 1))
        cluster_id = kafka_cluster_id(state / self.folder)
        secured = self.secrets(state)
        if secured is not None:
            secured.password("kafka-admin")  # the brokers' own user (infra/local/kafka.sh reads it)
        secure = {"KAFKA_SECURE_DIR": str(secured.folder)} if secured else {}
        return [
            Node(
                "kafka-broker",
                i,
                host,
                9092,
                {
                    "KAFKA_NAME": f"{self.folder}/kafka-{i}",
                    "KAFKA_HOST": host,
                    "KAFKA_NODE_ID": str(i),
                    "KAFKA_VOTERS": voters,
                    "KAFKA_REPLICATION": str(self.copies),
                    "KAFKA_CLUSTER_ID": cluster_id,
                    "KAFKA_START_TIMEOUT": "240",  # a restart under load replays the whole metadata log
                    **secure,
                },
            )
            for i, host in enumerate(self.hosts, 1)
        ]

    def cassandra_nodes(self, state: Path | None = None) -> list[Node]:
        if not self.folder:
            return [Node("cassandra-node", 1, self.hosts[0], 9042, {})]
        step = 2**64 // self.copies  # an even share of the Murmur3 ring each
        secured = self.secrets(state)
        secure = {"CASSANDRA_SECURE_DIR": str(secured.folder)} if secured else {}
        return [
            Node(
                "cassandra-node",
                i,
                host,
                9042,
                {
                    "CASSANDRA_NAME": f"{self.folder}/cassandra-{i}",
                    "CASSANDRA_HOST": host,
                    "CASSANDRA_SEEDS": self.hosts[0],
                    "CASSANDRA_INITIAL_TOKEN": str(-(2**63) + (i - 1) * step),
                    **secure,
                },
            )
            for i, host in enumerate(self.hosts, 1)
        ]

    def nodes(self, state: Path) -> list[Node]:
        return [*self.brokers(state), *self.cassandra_nodes(state)]

    def wipe(self, state: Path) -> None:
        """Stop every node and delete its data (a test or benchmark starts from an empty cluster: a broker
        restarted over the partitions of many earlier runs took over 90 s to replay its metadata)."""
        each(self.nodes(state), "reset")


def _text(value: object) -> str:
    """A setting as its environment variable holds it."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    return value if isinstance(value, str) else json.dumps(value)


SINGLE_NODE = Topology()
CLUSTER = Topology(("127.0.0.11", "127.0.0.12", "127.0.0.13"), "cluster", secured=True)
CASSANDRA_ROLE = "parley"  # the role every process signs in as on a secured cluster


def secure_kafka(topology: Topology, state: Path, namespace: str) -> None:
    """Every stage's Kafka user and the namespace's ACLs, granted as `admin` (infra/kafka_acls.py)."""
    from confluent_kafka.admin import AdminClient

    from runtime.kafka_auth import client_config

    secured = topology.secrets(state)
    assert secured is not None
    admin = AdminClient(client_config(topology.kafka_bootstrap))
    kafka_acls.grant(admin, namespace, "_schemas", lambda user: secured.password(f"kafka-{user}"))


def secure_cassandra(topology: Topology, state: Path) -> None:
    """A secured cluster's roles, once: the built-in superuser `cassandra` (password `cassandra`) makes the role
    the stack signs in as, with the roles' keyspace copied to every node first so a node's death never stops a
    sign-in; then `cassandra` is locked. Done already: the stack's role signs in, and nothing changes."""
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import Cluster, NoHostAvailable

    from storage.session import tls

    secured = topology.secrets(state)
    assert secured is not None
    password = secured.password("cassandra")

    def session(user: str, word: str) -> Any:
        cluster = Cluster(
            list(topology.hosts),
            protocol_version=5,
            auth_provider=PlainTextAuthProvider(user, word),
            ssl_context=tls(str(secured.ca)),
        )
        return cluster.connect()

    try:
        session(CASSANDRA_ROLE, password).cluster.shutdown()
        return
    except NoHostAvailable:
        pass
    deadline = time.monotonic() + 120
    while True:  # the built-in superuser is made moments after the first node starts
        try:
            first = session("cassandra", "cassandra")
            break
        except NoHostAvailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)
    try:
        copies = {"class": "NetworkTopologyStrategy", "datacenter1": topology.copies}
        first.execute(f"ALTER KEYSPACE system_auth WITH replication = {copies}", timeout=60)
        first.execute(
            f"CREATE ROLE IF NOT EXISTS {CASSANDRA_ROLE} WITH PASSWORD = %s AND LOGIN = true "
            "AND SUPERUSER = true",
            (password,),
            timeout=60,
        )
    finally:
        first.cluster.shutdown()
    ours = session(CASSANDRA_ROLE, password)
    try:
        ours.execute(
            "ALTER ROLE cassandra WITH PASSWORD = %s AND LOGIN = false",
            (secured.password("cassandra-builtin"),),
            timeout=60,
        )
    finally:
        ours.cluster.shutdown()


def kafka_cluster_id(folder: Path) -> str:
    """Every broker of a cluster is formatted with one id (22 characters of URL-safe base64), made once."""
    path = folder / "kafka-cluster-id"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))
    return path.read_text().strip()
