"""A backup of the suite's stack and its restore onto fresh stores, through the real CLI (`parley backup`,
`parley restore`): a fresh keyspace, a fresh ClickHouse engine folder and a fresh schema registry on its own topic
stand for the fresh cluster, beside the suite's stack, which goes on as it was."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from confluent_kafka.admin import AdminClient

from runtime.settings import StackSettings

from .conftest import BOOTSTRAP, PORT_BASE


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "infra.cli", *args, "--port-base", str(PORT_BASE)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})


def take(live, folder: Path) -> dict:
    done = cli("backup", str(folder), "--namespace", live.namespace)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def backup_text(folder: Path) -> str:
    """Every file of a backup, unzipped: what anyone holding it reads without keys."""
    return "".join(
        gzip.decompress(p.read_bytes()).decode() if p.suffix == ".gz" else p.read_text()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    )


@dataclass
class Fresh:
    """The stores a restore writes to: their settings, and the CLI's environment that names them."""

    settings: StackSettings
    registry_url: str

    @property
    def namespace(self) -> str:
        return self.settings.namespace

    @property
    def usage_url(self) -> str:
        return self.settings.usage_url

    def restore(self, folder: Path) -> subprocess.CompletedProcess[str]:
        return cli(
            "restore",
            str(folder),
            "--namespace",
            self.namespace,
            "--registry-url",
            self.registry_url,
            env={"PARLEY_USAGE_URL": self.usage_url},
        )

    def usage(self, sql: str) -> list[dict]:
        """A query of the restored ClickHouse engine folder (opened in a process of its own, as chdb wants)."""
        code = (
            "import json, sys\nfrom pathlib import Path\nfrom storage.clickhouse import ChdbBackend\n"
            "print(json.dumps(ChdbBackend(Path(sys.argv[1])).query(sys.argv[2])))"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, self.usage_url.removeprefix("chdb://"), sql],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return list(json.loads(done.stdout))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def fresh(live, name: str) -> Iterator[Fresh]:
    """Fresh stores for a restore: a keyspace and an engine folder of their own, and a schema registry started on
    a topic of its own (dropped and deleted after)."""
    namespace = f"{live.namespace}{name}"
    topic = f"_schemas_{namespace}"
    port = _free_port()
    service = next(s for s in live.stack.services() if s.name == "schema-registry")
    env = {**os.environ, **service.env, "PARLEY_REGISTRY_PORT": str(port), "PARLEY_REGISTRY_TOPIC": topic}
    registry = subprocess.Popen([sys.executable, "-m", "registry"], env=env)
    url = f"http://127.0.0.1:{port}"
    folder = tempfile.mkdtemp(prefix=f"parley-restore-{namespace}-")
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the fresh registry did not start"
            time.sleep(0.3)
        settings = live.stack.settings.model_copy(update={"namespace": namespace, "usage_url": f"chdb://{folder}"})
        yield Fresh(settings, url)
    finally:
        registry.terminate()
        registry.wait(30)
        from storage.schema import drop_keyspace

        drop_keyspace(live.stack.settings.model_copy(update={"namespace": namespace}).cassandra)
        AdminClient({"bootstrap.servers": BOOTSTRAP}).delete_topics([topic])
