"""The local stack: Kafka and Cassandra as JVMs, then every pipeline stage and the edge as processes.

Each process gets its settings through PARLEY_* environment variables, its log under <state>/logs and a
pid file under <state>/run. A stack runs under a namespace (topic prefix, keyspace, consumer groups) and a
port base, so a test stack can run beside `make up` without touching it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from topics.settings import REPO_ROOT, state_dir

LOCAL = REPO_ROOT / "infra" / "local"
# Sequences each pool's engine keeps in flight: many short ones, or few long ones (the same KV memory).
POOL_SLOTS = {"small": 8, "large": 2}


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
    state: Path = field(default_factory=state_dir)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def tag(self) -> str:
        return self.namespace or "default"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port_base}"

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
        }
        py = sys.executable
        out = []
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
                        "/healthz",
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
                        "/metrics",
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
                        "PARLEY_REPLY_PARTITION": str(replica),
                    },
                    port,
                    "/healthz",
                )
            )
        return out

    def engine_url(self, pool: str = "small", index: int = 0) -> str:
        """The llama-server behind one inference consumer (for benchmarks that compare against it directly)."""
        service = next(s for s in self.services() if s.name == f"inference-{pool}-{index}")
        return f"http://127.0.0.1:{service.port + 1}"

    # -- steps ---------------------------------------------------------------------------------------
    def _step(self, name: str, fn: Callable[[], object]) -> None:
        started = time.perf_counter()
        print(f"==> {name}", file=sys.stderr, flush=True)
        fn()
        self.timings[name] = round(time.perf_counter() - started, 2)

    def infrastructure(self) -> None:
        self._step("kafka", lambda: _sh(LOCAL / "kafka.sh", "start"))
        self._step("cassandra", lambda: _sh(LOCAL / "cassandra.sh", "start"))
        self._step("llama-server build", lambda: _sh(LOCAL / "build-llama-server.sh"))
        self._step("tokenizers", self._tokenizers)

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

        self._step(
            "topics", lambda: ensure_topics(os.environ.get("PARLEY_KAFKA_BOOTSTRAP", "127.0.0.1:9092"), self.namespace)
        )

    def start(self) -> None:
        for service in self.services():
            if _alive(self._path("run", f"{service.name}.pid")):
                continue
            if _listening(service.port):
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
        self.start()
        self.wait_ready()
        self._path("run", "timings.json").write_text(json.dumps(self.timings, indent=2))

    def stop(self) -> None:
        for service in reversed(self.services()):
            _terminate(self._path("run", f"{service.name}.pid"))

    def down(self) -> None:
        self.stop()
        _sh(LOCAL / "cassandra.sh", "stop")
        _sh(LOCAL / "kafka.sh", "stop")

    def pids(self) -> dict[str, int]:
        found = {}
        for service in self.services():
            pid_file = self._path("run", f"{service.name}.pid")
            if _alive(pid_file):
                found[service.name] = int(pid_file.read_text())
        return found


def _sh(script: Path, *args: str) -> None:
    """Progress of the infra scripts goes to stderr, so tools that print JSON keep a clean stdout."""
    subprocess.run(["bash", str(script), *args], check=True, stdout=sys.stderr)


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


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
