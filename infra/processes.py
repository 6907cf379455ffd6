"""Processes of the local stack: the infra/local scripts that run Kafka and Cassandra, and the pid files, ports and
process groups every stack process is started and stopped by."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx

from runtime.settings import REPO_ROOT

LOCAL = REPO_ROOT / "infra" / "local"


class Runs(Protocol):
    def sh(self, *args: str) -> None: ...


def sh(script: Path, *args: str, env: dict[str, str] | None = None) -> None:
    """Progress of the infra scripts goes to stderr, so tools that print JSON keep a clean stdout."""
    subprocess.run(
        ["bash", str(script), *args],
        check=True,
        stdout=sys.stderr,
        env={**os.environ, **(env or {})},
    )


def each(nodes: Sequence[Runs], command: str) -> None:
    """Run one script command on several nodes at once; raises the first failure."""
    with ThreadPoolExecutor(max(1, len(nodes))) as pool:
        for done in [pool.submit(node.sh, command) for node in nodes]:
            done.result()


def child_of(pid: int, command: str) -> int | None:
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


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def held(port: int, grace_s: float = 30.0) -> bool:
    """The port stays taken for `grace_s`: a process that has just died can hold it a little longer (its main
    thread shows as a zombie while another thread is still exiting, as after a stage's os._exit)."""
    deadline = time.monotonic() + grace_s
    while listening(port):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.2)
    return False


def alive(pid_file: Path) -> bool:
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


def terminate(pid_files: Sequence[Path], timeout_s: float = 15.0) -> None:
    """SIGTERM to each process's group at once, then SIGKILL to any still running after `timeout_s`: each shuts
    down on its own (a stage commits what it finished, an edge closes its streams), so they need not wait for
    each other, and a stack of twenty stops in the time of its slowest."""
    running = []
    for path in pid_files:
        if alive(path):
            running.append((path, int(path.read_text())))
        else:
            path.unlink(missing_ok=True)
    for _, pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(path) for path, _ in running):
        time.sleep(0.1)
    for path, pid in running:
        if alive(path):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        path.unlink(missing_ok=True)


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


def settled(response: httpx.Response) -> bool:
    """Ready, and for a stage also settled: its group is not rebalancing (a stage stays ready through a
    rebalance, processors/stage.py `readiness`; work started mid-rebalance would move in-flight events)."""
    if response.status_code != 200:
        return False
    try:
        body = response.json()
    except ValueError:
        return True
    return not isinstance(body, dict) or body.get("settled", True) is not False
