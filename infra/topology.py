"""Where a local stack's Kafka brokers and Cassandra nodes run: one of each (the default, one copy of every
record) or a cluster of three on 127.0.0.11-13 keeping three copies (`parley up --cluster`;
docs/decisions/0011-replicated-data-plane.md)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from infra.processes import LOCAL, each, sh


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

    @property
    def copies(self) -> int:
        return len(self.hosts)

    @property
    def majority(self) -> int:
        return self.copies // 2 + 1

    @property
    def kafka_bootstrap(self) -> str:
        return ",".join(f"{host}:9092" for host in self.hosts)

    def settings(self) -> dict[str, object]:
        """The settings (runtime/settings.py StackSettings) of every process on this topology."""
        return {
            "kafka_bootstrap": self.kafka_bootstrap,
            "kafka_replication_factor": self.copies,
            "kafka_min_insync_replicas": self.majority,
            "cassandra_hosts": ",".join(self.hosts),
            "cassandra_replication": {"datacenter1": self.copies},
        }

    def env(self) -> dict[str, str]:
        return {
            f"PARLEY_{k.upper()}": v if isinstance(v, str) else json.dumps(v)
            for k, v in self.settings().items()
        }

    def brokers(self, state: Path) -> list[Node]:
        if not self.folder:
            return [Node("kafka-broker", 1, self.hosts[0], 9092, {})]
        voters = ",".join(f"{i}@{host}:9093" for i, host in enumerate(self.hosts, 1))
        cluster_id = kafka_cluster_id(state / self.folder)
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
                },
            )
            for i, host in enumerate(self.hosts, 1)
        ]

    def cassandra_nodes(self) -> list[Node]:
        if not self.folder:
            return [Node("cassandra-node", 1, self.hosts[0], 9042, {})]
        step = 2**64 // self.copies  # an even share of the Murmur3 ring each
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
                },
            )
            for i, host in enumerate(self.hosts, 1)
        ]

    def nodes(self, state: Path) -> list[Node]:
        return [*self.brokers(state), *self.cassandra_nodes()]

    def wipe(self, state: Path) -> None:
        """Stop every node and delete its data (a test or benchmark starts from an empty cluster: a broker
        restarted over the partitions of many earlier runs took over 90 s to replay its metadata)."""
        each(self.nodes(state), "reset")


SINGLE_NODE = Topology()
CLUSTER = Topology(("127.0.0.11", "127.0.0.12", "127.0.0.13"), "cluster")


def kafka_cluster_id(folder: Path) -> str:
    """Every broker of a cluster is formatted with one id (22 characters of URL-safe base64), made once."""
    path = folder / "kafka-cluster-id"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))
    return path.read_text().strip()
