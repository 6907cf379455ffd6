"""docker-compose.yml run the way compose runs it, without a container engine: each service's own command and
environment (with the image's ENV under them and `${VAR:?}` interpolated), started in depends_on order, gated
on its healthcheck (its own test command) or on its exit, and given its own loopback address that its service
name resolves to in every environment value, as a compose network would. What cannot run here is replaced, and
only that: Kafka and Cassandra by the local ones (infra/local), the ClickHouse server by the embedded engine
(no modern ClickHouse server installs here: INFRA.md), and Prometheus, the Kafka exporter and Grafana are not
started (their images are not runnable here; their configuration is checked in tests/unit).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from runtime.llama_server import default_binary
from runtime.settings import REPO_ROOT

COMPOSE = REPO_ROOT / "docker-compose.yml"
LOCAL_STORES = {"kafka": "127.0.0.1", "cassandra": "127.0.0.1"}  # run by infra/local, already up
NOT_HERE = {"clickhouse", "prometheus", "kafka-exporter", "grafana"}


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} (the error raises, as compose refuses to start)."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3) or ""
        if env.get(name):
            return env[name]
        if op == ":?":
            raise ValueError(f"{name}: {arg}")
        return arg if op == ":-" else ""

    return re.sub(r"\$\{(\w+)(?:(:[-?])([^}]*))?\}", one, value)


def image_env() -> dict[str, str]:
    """The ENV of the Dockerfile's final stage (what every Parley container starts with)."""
    final = (REPO_ROOT / "Dockerfile").read_text().rsplit("\nFROM ", 1)[1]
    text = final.replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            for pair in shlex.split(line[4:]):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


@dataclass
class Service:
    name: str
    spec: dict
    address: str
    state: Path
    process: subprocess.Popen | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.state / "log"


class Topology:
    def __init__(self, scratch: Path, env: dict[str, str], profile: str = "cpu", overrides: dict | None = None):
        compose = yaml.safe_load(COMPOSE.read_text())
        self.env = env
        self.overrides = overrides or {}
        self.services: dict[str, Service] = {}
        self.hosts = dict(LOCAL_STORES)
        self.volumes = {name: scratch / "volumes" / name for name in compose.get("volumes", {})}
        for index, (name, spec) in enumerate(compose["services"].items()):
            if name in LOCAL_STORES or name in NOT_HERE:
                continue
            if spec.get("profiles") and profile not in spec["profiles"]:
                continue
            address = f"127.0.1.{index + 1}"
            self.hosts[name] = address
            self.services[name] = Service(name, spec, address, scratch / "services" / name)
        for path in self.volumes.values():
            path.mkdir(parents=True, exist_ok=True)

    # -- the compose network and volumes, locally -----------------------------------------------------
    def resolve(self, value: str, own: str, bare: bool = False) -> str:
        """Service names before a port (or alone, in an environment value: `bare`) become their addresses;
        0.0.0.0, localhost and 127.0.0.1 become the service's own."""
        names = "|".join(sorted(map(re.escape, self.hosts), key=len, reverse=True))
        after = r"(?=:\d|$|,)" if bare else r"(?=:\d)"
        value = re.sub(r"\b(0\.0\.0\.0|localhost|127\.0\.0\.1)\b", own, value)  # the container's own
        return re.sub(rf"(?<![\w.-])({names}){after}", lambda m: self.hosts[m.group(1)], value)

    def mounted(self, service: Service, value: str) -> str:
        """A path inside a container's volume mount becomes the volume's folder here."""
        for mount in service.spec.get("volumes", []):
            source, target = mount.split(":")[:2]
            if source in self.volumes:
                value = value.replace(target, str(self.volumes[source]))
        return value

    def environment(self, service: Service) -> dict[str, str]:
        env = {**image_env(), **{k: str(v) for k, v in (service.spec.get("environment") or {}).items()}}
        env = {
            k: self.mounted(service, self.resolve(interpolate(v, self.env), service.address, bare=True))
            for k, v in env.items()
        }
        env["PYTHONPATH"] = str(REPO_ROOT)  # the image's /app
        env["LOCAL_INFRA_STATE"] = str(service.state / "volume")  # the image's state volume
        env.update(self.overrides.get(service.name, {}))
        return {**os.environ, **env}

    def argv(self, service: Service) -> list[str]:
        command = [self.mounted(service, self.resolve(str(a), service.address)) for a in service.spec["command"]]
        image = str(service.spec.get("image", ""))
        if image.startswith("ghcr.io/ggml-org/llama.cpp:server"):  # that image's entrypoint is llama-server
            return [str(default_binary()), *command]
        assert command[0] == "python", (service.name, command)
        return [sys.executable, *command[1:]]

    # -- lifecycle ------------------------------------------------------------------------------------
    def order(self) -> list[Service]:
        done: list[str] = []

        def visit(name: str, path: tuple[str, ...] = ()) -> None:
            if name in done or name not in self.services:
                return
            assert name not in path, f"depends_on cycle: {path}"
            for dep in self.services[name].spec.get("depends_on") or {}:
                visit(dep, (*path, name))
            done.append(name)

        for name in self.services:
            visit(name)
        return [self.services[name] for name in done]

    def start(self, timeout_s: float = 300.0) -> None:
        for service in self.order():
            for dep, rule in (service.spec.get("depends_on") or {}).items():
                if dep in self.services:
                    self.wait(self.services[dep], rule["condition"], timeout_s)
            service.state.mkdir(parents=True, exist_ok=True)
            with service.log.open("ab") as log:
                service.process = subprocess.Popen(
                    self.argv(service),
                    env=self.environment(service),
                    cwd=service.state,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        for service in self.services.values():
            if service.spec.get("restart") != "no":
                self.wait(service, "service_healthy", timeout_s)

    def wait(self, service: Service, condition: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        assert service.process is not None, service.name
        while time.monotonic() < deadline:
            code = service.process.poll()
            if condition == "service_completed_successfully":
                if code is not None:
                    assert code == 0, f"{service.name} exited {code}:\n{self.tail(service)}"
                    return
            else:
                assert code is None, f"{service.name} exited {code}:\n{self.tail(service)}"
                if condition == "service_started" or self.healthy(service):
                    return
            time.sleep(1.0)
        raise TimeoutError(f"{service.name} not {condition} after {timeout_s:.0f}s:\n{self.tail(service)}")

    def healthy(self, service: Service) -> bool:
        """The service's own healthcheck command, run against its address."""
        check = service.spec.get("healthcheck")
        if not check:
            return True
        kind, *rest = check["test"]
        assert kind == "CMD-SHELL", (service.name, kind)
        command = self.resolve(rest[0], service.address).replace("python -c", f"{shlex.quote(sys.executable)} -c")
        env = {**os.environ, **{k: v for k, v in self.environment(service).items() if k.startswith("PARLEY_")}}
        return subprocess.run(["bash", "-c", command], env=env, capture_output=True, timeout=30).returncode == 0

    def tail(self, service: Service) -> str:
        return service.log.read_text(errors="replace")[-3000:] if service.log.exists() else ""

    def stop(self) -> None:
        for service in reversed(self.order()):
            if service.process is not None and service.process.poll() is None:
                os.killpg(service.process.pid, signal.SIGTERM)
        for service in self.services.values():
            if service.process is not None:
                try:
                    service.process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(service.process.pid, signal.SIGKILL)
                    service.process.wait()

    def url(self, name: str, port: int) -> str:
        return f"http://{self.services[name].address}:{port}"
