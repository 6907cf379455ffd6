"""The local stack: Kafka and Cassandra as JVMs, then every pipeline stage and the edge as processes.

Each process gets its settings through PARLEY_* environment variables, its log under <state>/logs and a
pid file under <state>/run. A stack runs under a namespace (topic prefix, keyspace, consumer groups) and a
port base, so a test stack can run beside `make up` without touching it. It runs on a topology: one Kafka
broker and one Cassandra node keeping one copy (the default), or a local cluster of three of each, on
127.0.0.11-13, keeping three copies (`parley up --cluster`; docs/decisions/0011-replicated-data-plane.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from infra.processes import LOCAL, Service, alive, child_of, each, held, settled, sh, terminate
from infra.topology import SINGLE_NODE, Topology, secure_cassandra, secure_kafka
from runtime.settings import REPO_ROOT, StackSettings, local_kek, state_dir
from topics.pipeline import FAUST_STAGES, process

# Sequences each pool's engine keeps in flight: many short ones, or few long ones (the same KV memory).
POOL_SLOTS = {"small": 8, "large": 2}


# By module (or program); the rest are stages.
ROLES = {
    "api": "edge",
    "inference": "inference",
    "registry": "schema-registry",
    "otelcol": "collector",
}


@dataclass
class Stack:
    namespace: str = ""
    port_base: int = 8000
    replicas: int = 1  # edge replicas, each on its own port and reply partition
    stages: int = 1  # replicas of each processor stage (metering: one with the embedded engine)
    workers: dict[str, int] = field(
        default_factory=lambda: {"small": 1, "large": 1}
    )  # inference consumers per pool
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
            # the local stack accepts `parley token`'s development tokens (scripts, tests, the sign-in link)
            "PARLEY_DEV_TOKENS": "true",
            "PARLEY_KEK_FILE": self.kek_file,
            "PARLEY_METERING_URL": f"http://127.0.0.1:{self.port_base + 13}",
            "PARLEY_USAGE_URL": f"chdb://{self.state / 'clickhouse' / self.tag}",
            "PARLEY_SCHEMA_REGISTRY_URL": self.registry or self.registry_url,
            # Spans go to this stack's collector, unless the caller names an OTLP endpoint of their own.
            "OTEL_EXPORTER_OTLP_ENDPOINT": os.environ.get(
                "OTEL_EXPORTER_OTLP_ENDPOINT", self.otlp_url
            ),
            "OTEL_BSP_SCHEDULE_DELAY": os.environ.get("OTEL_BSP_SCHEDULE_DELAY", "1000"),
            **self.topology.env(self.state),
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
            Service(
                "schema-registry", (py, "-m", "registry"), registry, self.port_base + 81, "/readyz"
            ),
        ]
        for replica in range(self.stages):
            for offset, stage in enumerate(FAUST_STAGES):
                if replica and not process(stage).scales:
                    continue  # metering: the embedded ClickHouse engine (chdb) is opened by one process only
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
        port = (
            self.port_base + 20
        )  # each inference consumer: a metrics port and its llama-server's port
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
        # on a secured topology each process signs in to Kafka as its own stage
        out = [replace(s, env={**s.env, **self.topology.signin(s.name, self.state)}) for s in out]
        return [s for s in out if s.name in self.only] if self.only else out

    def engine_url(self, pool: str = "small", index: int = 0) -> str:
        """The llama-server behind one inference consumer (for benchmarks that compare against it directly)."""
        service = next(s for s in self.services() if s.name == f"inference-{pool}-{index}")
        return f"http://127.0.0.1:{service.port + 1}"

    def engine_headers(self, pool: str = "small", index: int = 0) -> dict[str, str]:
        """The credential of that llama-server, which answers only its consumer (and whoever reads its key)."""
        from runtime.llama_server import key_path

        port = int(self.engine_url(pool, index).rsplit(":", 1)[1])
        return {
            "Authorization": f"Bearer {key_path(self.namespace, pool, port).read_text().strip()}"
        }

    # -- steps ---------------------------------------------------------------------------------------
    def _step(self, name: str, fn: Callable[[], object]) -> None:
        started = time.perf_counter()
        print(f"==> {name}", file=sys.stderr, flush=True)
        fn()
        self.timings[name] = round(time.perf_counter() - started, 2)

    def infrastructure(self) -> None:
        """Every broker at once (a quorum forms only once a majority is up); the first Cassandra node (the seed),
        then the others together."""
        brokers, nodes = (
            self.topology.brokers(self.state),
            self.topology.cassandra_nodes(self.state),
        )
        self._step("kafka", lambda: each(brokers, "start"))

        def cassandra() -> None:
            each(nodes[:1], "start")
            each(nodes[1:], "start")
            if self.topology.secured:
                secure_cassandra(self.topology, self.state)

        self._step("cassandra", cassandra)
        self._step("llama-server build", lambda: sh(LOCAL / "build-llama-server.sh"))
        self._step("collector build", lambda: sh(LOCAL / "build-otelcol.sh"))
        self.spans_file.parent.mkdir(parents=True, exist_ok=True)
        self._step("tokenizers", self._tokenizers)

    @property
    def kek_file(self) -> str:
        """The deployment's key-encryption key file where one is given (PARLEY_KEK, if set, wins over any
        file); else the local stack's, made once in its state folder."""
        return os.environ.get("PARLEY_KEK_FILE") or str(local_kek(self.state))

    @property
    def settings(self) -> StackSettings:
        """The shared settings every process of this stack runs with."""
        return StackSettings().model_copy(
            update={
                "namespace": self.namespace,
                "kek_file": self.kek_file,
                **self.topology.settings(self.state),
            }
        )

    def _tokenizers(self) -> None:
        """Rebuild each pool's tokenizer from its model file once, before the stages that count with it start
        (conversation/tokens.py caches it in the state folder; every stage building its own took ~30 s of CPU each)."""
        code = (
            "from conversation import tokens; from runtime.settings import StackSettings as S; "
            "[tokens.load(p.tokenizer) for p in S().pools.values()]"
        )
        env = {**os.environ, "LOCAL_INFRA_STATE": str(self.state)}
        subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=REPO_ROOT)

    def topics(self) -> None:
        from runtime.kafka import ensure_topics
        from runtime.kafka_auth import secure

        settings = self.settings
        secure(settings)  # this process's own clients: the stack's tools sign in as admin
        self._step(
            "topics",
            lambda: ensure_topics(settings.kafka_bootstrap, self.namespace, settings.layout),
        )
        if self.topology.secured:
            self._step(
                "kafka users and ACLs",
                lambda: secure_kafka(self.topology, self.state, self.namespace),
            )

    def schema(self) -> None:
        from storage.schema import migrate

        self._step("schema", lambda: migrate(self.settings.cassandra))

    def start(self) -> None:
        for service in self.services():
            if alive(self._path("run", f"{service.name}.pid")):
                continue
            if held(service.port):
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
                    if not alive(self._path("run", f"{name}.pid")):
                        tail = self._path("logs", f"{name}.log").read_text(errors="replace")[-3000:]
                        raise RuntimeError(f"{name} exited during start-up:\n{tail}")
                    try:
                        if settled(httpx.get(service.health, timeout=1.0)):
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
        """The pipeline's processes together, then the schema registry and the collector, which the others use
        until they exit (their records' types, their last spans)."""
        last = ("schema-registry", "otelcol")
        terminate(
            [self._path("run", f"{s.name}.pid") for s in self.services() if s.name not in last]
        )
        for name in last:
            terminate([self._path("run", f"{name}.pid")])

    def forget(self) -> None:
        """Drop the namespace's topics and keyspace once its processes are stopped (a benchmark's stack: left
        behind, some hundred benchmark keyspaces filled Cassandra's 512 MB heap on a development machine)."""
        from runtime.kafka import delete_topics
        from storage.schema import drop_keyspace

        if not self.namespace:
            raise ValueError(
                "the default namespace is a deployment's own: only a named namespace is forgotten"
            )
        try:
            delete_topics(self.settings.kafka_bootstrap, self.namespace)
            drop_keyspace(self.settings.cassandra)
        except Exception as exc:  # left behind, as before: the caller's results matter more
            print(f"could not drop namespace {self.namespace}: {exc}", file=sys.stderr)

    def down(self) -> None:
        self.stop()
        each(self.topology.cassandra_nodes(self.state), "stop")
        each(self.topology.brokers(self.state), "stop")

    def status(self) -> list[dict[str, object]]:
        """Every process of the stack: brokers, Cassandra nodes, the pipeline's processes and their engines."""
        rows: list[dict[str, object]] = []
        for node in self.topology.nodes(self.state):
            address = f"{node.host}:{node.port}"
            row: dict[str, object] = {
                "name": node.name,
                "role": node.role,
                "pid": node.pid(),
                "address": address,
            }
            if node.role == "kafka-broker":
                row["broker_id"] = node.index
            rows.append(row)
        running = self.pids()
        for service in self.services():
            role = ROLES.get(service.argv[-1], ROLES.get(service.name, "stage"))
            pid = running.get(service.name)
            address = f"127.0.0.1:{service.port}"
            rows.append({"name": service.name, "role": role, "pid": pid, "address": address})
            if role == "inference":
                engine = child_of(pid, "llama-server") if pid else None
                address = f"127.0.0.1:{service.env['PARLEY_LLAMA_PORT']}"
                rows.append(
                    {
                        "name": f"engine-{service.name}",
                        "role": "engine",
                        "pid": engine,
                        "address": address,
                    }
                )
        return rows

    def pids(self) -> dict[str, int]:
        found = {}
        for service in self.services():
            pid_file = self._path("run", f"{service.name}.pid")
            if alive(pid_file):
                found[service.name] = int(pid_file.read_text())
        return found
