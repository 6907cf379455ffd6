"""The local stack: Kafka and Cassandra as JVMs, then every pipeline stage and the edge as processes.

Each process gets its settings through PARLEY_* environment variables, its log under <state>/logs and a
pid file under <state>/run. A stack runs under a namespace (topic prefix, keyspace, consumer groups) and a
port base, so a test stack can run beside `make up` without touching it. It runs on a topology: one Kafka
broker and one Cassandra node keeping one copy (the default), or a local cluster of three of each, on
127.0.0.11-13, keeping three copies (`parley up --cluster`; docs/decisions/0011-replicated-data-plane.md).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from topics.settings import REPO_ROOT, StackSettings, state_dir

LOCAL = REPO_ROOT / "infra" / "local"
# Sequences each pool's engine keeps in flight: many short ones, or few long ones (the same KV memory).
POOL_SLOTS = {"small": 8, "large": 2}


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
        _sh(self.script, *args, env=self.env)

    def pid(self) -> int | None:
        found = subprocess.run(
            ["bash", str(self.script), "pid"], env={**os.environ, **self.env}, capture_output=True, text=True
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
        """The settings (topics/settings.py StackSettings) of every process on this topology."""
        return {
            "kafka_bootstrap": self.kafka_bootstrap,
            "kafka_replication_factor": self.copies,
            "kafka_min_insync_replicas": self.majority,
            "cassandra_hosts": ",".join(self.hosts),
            "cassandra_replication": {"datacenter1": self.copies},
        }

    def env(self) -> dict[str, str]:
        return {f"PARLEY_{k.upper()}": v if isinstance(v, str) else json.dumps(v) for k, v in self.settings().items()}

    def brokers(self, state: Path) -> list[Node]:
        if not self.folder:
            return [Node("kafka-broker", 1, self.hosts[0], 9092, {})]
        voters = ",".join(f"{i}@{host}:9093" for i, host in enumerate(self.hosts, 1))
        cluster_id = _kafka_cluster_id(state / self.folder)
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
                    "KAFKA_HEAP": "384m",
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
                    "CASSANDRA_HEAP": "512m",
                },
            )
            for i, host in enumerate(self.hosts, 1)
        ]

    def nodes(self, state: Path) -> list[Node]:
        return [*self.brokers(state), *self.cassandra_nodes()]

    def wipe(self, state: Path) -> None:
        """Stop every node and delete its data (a test or benchmark starts from an empty cluster: a broker
        restarted over the partitions of many earlier runs took over 90 s to replay its metadata)."""
        _each(self.nodes(state), "reset")


SINGLE_NODE = Topology()
# By module (or program); the rest are stages.
ROLES = {"api": "edge", "inference": "inference", "registry": "schema-registry", "otelcol": "collector"}
CLUSTER = Topology(("127.0.0.11", "127.0.0.12", "127.0.0.13"), "cluster")


def _kafka_cluster_id(folder: Path) -> str:
    """Every broker of a cluster is formatted with one id (22 characters of URL-safe base64), made once."""
    path = folder / "kafka-cluster-id"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))
    return path.read_text().strip()


@dataclass(frozen=True)
class Service:
    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    port: int
    health_path: str  # answers 200 once ready

    @property
    def health(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.health_path}"


@dataclass
class Stack:
    namespace: str = ""
    port_base: int = 8000
    replicas: int = 1  # edge replicas, each on its own port and reply partition
    stages: int = 1  # replicas of each processor stage (metering: one with the embedded engine)
    workers: dict[str, int] = field(default_factory=lambda: {"small": 1, "large": 1})  # inference consumers per pool
    topology: Topology = SINGLE_NODE
    state: Path = field(default_factory=state_dir)
    timings: dict[str, float] = field(default_factory=dict)
    # A part of a stack (parley replay runs a few stages of its own against production's Kafka and registry):
    # only these services, this registry instead of the stack's own, and these settings over the shared ones.
    only: tuple[str, ...] = ()
    registry: str = ""
    overrides: dict[str, str] = field(default_factory=dict)

    @property
    def tag(self) -> str:
        return self.namespace or "default"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port_base}"

    @property
    def registry_url(self) -> str:
        return f"http://127.0.0.1:{self.port_base + 81}"

    @property
    def otlp_url(self) -> str:
        """Where every process sends its spans: this stack's collector (OTLP over HTTP)."""
        return f"http://127.0.0.1:{self.port_base + 18}"

    @property
    def spans_file(self) -> Path:
        """The collector writes every span here: OTLP JSON, one batch a line (`parley trace RUN_ID` reads it)."""
        return self.state / "traces" / self.tag / "spans.jsonl"

    def _path(self, kind: str, name: str) -> Path:
        folder = self.state / kind / self.tag
        folder.mkdir(parents=True, exist_ok=True)
        return folder / name

    def services(self) -> list[Service]:
        base = {
            "PARLEY_NAMESPACE": self.namespace,
            "LOCAL_INFRA_STATE": str(self.state),
            "PARLEY_METERING_URL": f"http://127.0.0.1:{self.port_base + 13}",
            "PARLEY_USAGE_URL": f"chdb://{self.state / 'clickhouse' / self.tag}",
            "PARLEY_SCHEMA_REGISTRY_URL": self.registry or self.registry_url,
            # Spans go to this stack's collector, unless the caller names an OTLP endpoint of their own.
            "OTEL_EXPORTER_OTLP_ENDPOINT": os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", self.otlp_url),
            "OTEL_BSP_SCHEDULE_DELAY": os.environ.get("OTEL_BSP_SCHEDULE_DELAY", "1000"),
            **self.topology.env(),
            **self.overrides,
        }
        py = sys.executable
        # The collector first (OpenTelemetry's, built by infra/local/build-otelcol.sh), then the schema registry:
        # every other process registers its record types at start-up.
        collector = {
            "PARLEY_OTELCOL_OTLP": f"127.0.0.1:{self.port_base + 18}",
            "PARLEY_OTELCOL_HEALTH": f"127.0.0.1:{self.port_base + 19}",
            "PARLEY_SPANS_FILE": str(self.spans_file),
        }
        run_collector = f'exec "$(bash {LOCAL}/build-otelcol.sh)" --config {REPO_ROOT}/infra/otelcol/config.yaml'
        registry = {**base, "PARLEY_REGISTRY_PORT": str(self.port_base + 81)}
        out = [
            Service("otelcol", ("bash", "-c", run_collector), collector, self.port_base + 19, "/"),
            Service("schema-registry", (py, "-m", "registry"), registry, self.port_base + 81, "/readyz"),
        ]
        for replica in range(self.stages):
            for offset, stage in enumerate(("moderation", "scheduling", "persistence", "metering", "memory")):
                if replica and stage == "metering":
                    continue  # the embedded ClickHouse engine (chdb) is opened by one process only
                port = self.port_base + 10 + offset + (30 + 5 * (replica - 1) if replica else 0)
                out.append(
                    Service(
                        stage if not replica else f"{stage}-{replica}",
                        (py, "-m", "processors", stage),
                        {**base, "PARLEY_WEB_PORT": str(port), "PARLEY_REPLICA": str(replica)},
                        port,
                        "/readyz",
                    )
                )
        port = self.port_base + 20  # each inference consumer: a metrics port and its llama-server's port
        for pool, count in self.workers.items():
            for index in range(count):
                out.append(
                    Service(
                        f"inference-{pool}-{index}",
                        (py, "-m", "inference"),
                        {
                            **base,
                            "PARLEY_POOL": pool,
                            "PARLEY_SLOTS": str(POOL_SLOTS.get(pool, 4)),
                            "PARLEY_WORKER_ID": f"{self.tag}-{pool}-{index}",
                            "PARLEY_METRICS_PORT": str(port),
                            "PARLEY_LLAMA_PORT": str(port + 1),
                        },
                        port,
                        "/readyz",
                    )
                )
                port += 2
        for replica in range(self.replicas):
            port = self.port_base + (replica * 100 if replica else 0)
            out.append(
                Service(
                    f"api-{replica}",
                    (py, "-m", "api"),
                    {
                        **base,
                        "PARLEY_PORT": str(port),
                    },
                    port,
                    "/readyz",
                )
            )
        return [s for s in out if s.name in self.only] if self.only else out

    def engine_url(self, pool: str = "small", index: int = 0) -> str:
        """The llama-server behind one inference consumer (for benchmarks that compare against it directly)."""
        service = next(s for s in self.services() if s.name == f"inference-{pool}-{index}")
        return f"http://127.0.0.1:{service.port + 1}"

    def engine_headers(self, pool: str = "small", index: int = 0) -> dict[str, str]:
        """The credential of that llama-server, which answers only its consumer (and whoever reads its key)."""
        from inference.llama_server import key_path

        port = int(self.engine_url(pool, index).rsplit(":", 1)[1])
        return {"Authorization": f"Bearer {key_path(self.namespace, pool, port).read_text().strip()}"}

    # -- steps ---------------------------------------------------------------------------------------
    def _step(self, name: str, fn: Callable[[], object]) -> None:
        started = time.perf_counter()
        print(f"==> {name}", file=sys.stderr, flush=True)
        fn()
        self.timings[name] = round(time.perf_counter() - started, 2)

    def infrastructure(self) -> None:
        """Every broker at once (a quorum forms only once a majority is up); the first Cassandra node (the seed),
        then the others together."""
        brokers, nodes = self.topology.brokers(self.state), self.topology.cassandra_nodes()
        self._step("kafka", lambda: _each(brokers, "start"))

        def cassandra() -> None:
            _each(nodes[:1], "start")
            _each(nodes[1:], "start")

        self._step("cassandra", cassandra)
        self._step("llama-server build", lambda: _sh(LOCAL / "build-llama-server.sh"))
        self._step("collector build", lambda: _sh(LOCAL / "build-otelcol.sh"))
        self.spans_file.parent.mkdir(parents=True, exist_ok=True)
        self._step("tokenizers", self._tokenizers)

    @property
    def settings(self) -> StackSettings:
        """The shared settings every process of this stack runs with."""
        return StackSettings().model_copy(update={"namespace": self.namespace, **self.topology.settings()})

    def _tokenizers(self) -> None:
        """Rebuild each pool's tokenizer from its model file once, before the stages that count with it start
        (topics/tokens.py caches it in the state folder; every stage building its own took ~30 s of CPU each)."""
        code = (
            "from topics import tokens; from topics.settings import StackSettings as S; "
            "[tokens.load(p.tokenizer) for p in S().pools.values()]"
        )
        env = {**os.environ, "LOCAL_INFRA_STATE": str(self.state)}
        subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=REPO_ROOT)

    def topics(self) -> None:
        from topics.kafka import ensure_topics

        settings = self.settings
        self._step("topics", lambda: ensure_topics(settings.kafka_bootstrap, self.namespace, settings.layout))

    def schema(self) -> None:
        from storage.schema import migrate

        self._step("schema", lambda: migrate(self.settings.cassandra))

    def start(self) -> None:
        for service in self.services():
            if _alive(self._path("run", f"{service.name}.pid")):
                continue
            if _held(service.port):
                raise RuntimeError(
                    f"port {service.port} for {service.name} is taken: another stack runs on this port base "
                    f"(stop it with `parley down --port-base {self.port_base}`, or pick another --port-base)"
                )
            log = self._path("logs", f"{service.name}.log").open("ab")
            env = {**os.environ, **service.env, "PYTHONUNBUFFERED": "1"}
            proc = subprocess.Popen(
                service.argv,
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            self._path("run", f"{service.name}.pid").write_text(str(proc.pid))

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        def ready() -> None:
            pending = {s.name: s for s in self.services()}
            deadline = time.monotonic() + timeout_s
            while pending and time.monotonic() < deadline:
                for name, service in list(pending.items()):
                    if not _alive(self._path("run", f"{name}.pid")):
                        tail = self._path("logs", f"{name}.log").read_text(errors="replace")[-3000:]
                        raise RuntimeError(f"{name} exited during start-up:\n{tail}")
                    try:
                        if httpx.get(service.health, timeout=1.0).status_code == 200:
                            del pending[name]
                    except httpx.HTTPError:
                        pass
                time.sleep(0.3)
            if pending:
                raise TimeoutError(f"not ready after {timeout_s:.0f}s: {', '.join(pending)}")

        self._step("pipeline start", ready)

    def up(self) -> None:
        self.infrastructure()
        self.topics()
        self.schema()
        self.start()
        self.wait_ready()
        self._path("run", "timings.json").write_text(json.dumps(self.timings, indent=2))

    def stop(self) -> None:
        for service in reversed(self.services()):
            _terminate(self._path("run", f"{service.name}.pid"))

    def down(self) -> None:
        self.stop()
        _each(self.topology.cassandra_nodes(), "stop")
        _each(self.topology.brokers(self.state), "stop")

    def status(self) -> list[dict[str, object]]:
        """Every process of the stack: brokers, Cassandra nodes, the pipeline's processes and their engines."""
        rows: list[dict[str, object]] = []
        for node in self.topology.nodes(self.state):
            row: dict[str, object] = {"name": node.name, "role": node.role, "pid": node.pid()}
            row["address"] = f"{node.host}:{node.port}"
            if node.role == "kafka-broker":
                row["broker_id"] = node.index
            rows.append(row)
        running = self.pids()
        for service in self.services():
            role = ROLES.get(service.argv[-1], ROLES.get(service.name, "stage"))
            pid = running.get(service.name)
            rows.append({"name": service.name, "role": role, "pid": pid, "address": f"127.0.0.1:{service.port}"})
            if role == "inference":
                engine = _child(pid, "llama-server") if pid else None
                port = int(service.env["PARLEY_LLAMA_PORT"])
                rows.append(
                    {"name": f"engine-{service.name}", "role": "engine", "pid": engine, "address": f"127.0.0.1:{port}"}
                )
        return rows

    def pids(self) -> dict[str, int]:
        found = {}
        for service in self.services():
            pid_file = self._path("run", f"{service.name}.pid")
            if _alive(pid_file):
                found[service.name] = int(pid_file.read_text())
        return found


def _sh(script: Path, *args: str, env: dict[str, str] | None = None) -> None:
    """Progress of the infra scripts goes to stderr, so tools that print JSON keep a clean stdout."""
    subprocess.run(["bash", str(script), *args], check=True, stdout=sys.stderr, env={**os.environ, **(env or {})})


def _each(nodes: list[Node], command: str) -> None:
    """Run one script command on several nodes at once; raises the first failure."""
    with ThreadPoolExecutor(max(1, len(nodes))) as pool:
        for done in [pool.submit(node.sh, command) for node in nodes]:
            done.result()


def _child(pid: int, command: str) -> int | None:
    """The pid of a direct child of `pid` whose executable is named `command` (an engine under its consumer)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            name = Path(f"/proc/{stat.parent.name}/exe").resolve().name
        except (OSError, IndexError):
            continue
        if fields[1] == str(pid) and name == command:
            return int(stat.parent.name)
    return None


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _held(port: int, grace_s: float = 30.0) -> bool:
    """The port stays taken for `grace_s`: a process that has just died can hold it a little longer (its main
    thread shows as a zombie while another thread is still exiting, seen in CI after a stage's os._exit)."""
    deadline = time.monotonic() + grace_s
    while _listening(port):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.2)
    return False


def _alive(pid_file: Path) -> bool:
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        return False
    # A zombie (exited, not yet reaped) is not alive.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _terminate(pid_file: Path, timeout_s: float = 15.0) -> None:
    if not _alive(pid_file):
        pid_file.unlink(missing_ok=True)
        return
    pid = int(pid_file.read_text())
    os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _alive(pid_file):
        time.sleep(0.1)
    if _alive(pid_file):
        os.killpg(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)
