"""What the stack's processes use, read from /proc: memory (Rss, Pss), CPU time, and pinning them to cores."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from infra.stack import Stack


def memory_mb(pid: int, field: str = "Rss") -> float:
    """A process's resident memory (Rss), or its proportional share (Pss: each page shared with other processes,
    such as a library or the encoder's mapped weights, counted once across them), in MB."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return 0.0


def cpu_ms(pid: int) -> float:
    """CPU time (user + system) a process has used so far, in ms (0 for one that is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def stack_cpu(stack: Stack) -> dict[str, float]:
    """CPU ms used so far by every process of the stack (as `parley status` lists them)."""
    return {str(row["name"]): cpu_ms(int(str(row["pid"]))) for row in stack.status() if row["pid"]}


def cpu_use(
    before: dict[str, float], after: dict[str, float], seconds: float, idle_ms_per_s: dict[str, float] | None, n: int
) -> dict[str, float]:
    """Per process: CPU ms per second (idle: no `idle_ms_per_s` given), or per pair less what it uses idle."""
    out = {}
    for name, end in after.items():
        used = end - before.get(name, end)
        if idle_ms_per_s is None:
            out[name] = round(used / seconds, 1)
        else:
            out[name] = round((used - idle_ms_per_s.get(name, 0.0) * seconds) / n, 1)
    out["total"] = round(sum(out.values()), 1)
    return out


def stack_memory(stack: Stack, field: str = "Rss") -> dict[str, float]:
    """Memory in MB of every process of the stack as `parley status` lists them (brokers, Cassandra nodes, the
    pipeline's processes, each engine under its own row), and their total. The Pss total is what the stack
    holds of the machine's memory; the Rss total counts a page shared by several processes once for each."""
    rows = {str(row["name"]): round(memory_mb(int(str(row["pid"])), field), 1) for row in stack.status() if row["pid"]}
    rows["total"] = round(sum(rows.values()), 1)
    return rows


def cpu_seconds(stack: Stack) -> dict[str, float]:
    """CPU time (user + system) each kind of process has used so far, summed over its replicas: brokers,
    Cassandra nodes, edges, each stage, inference consumers, engines, and this generator."""
    rows = [(str(row["role"]), str(row["name"]), int(str(row["pid"]))) for row in stack.status() if row["pid"]]
    used: dict[str, float] = {}
    for role, name, pid in [*rows, ("generator", "generator", os.getpid())]:
        kind = name if role == "stage" else role
        used[kind] = used.get(kind, 0.0) + cpu_ms(pid) / 1000
    return used


def cores_used(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Cores each kind of process kept busy over a phase (1.0: one core the whole time), busiest first."""
    busy = {kind: (after[kind] - before.get(kind, 0.0)) / seconds for kind in after}
    return {kind: round(v, 2) for kind, v in sorted(busy.items(), key=lambda kv: -kv[1])}


def unpin(stack: Stack) -> None:
    """Every process of the stack on every core again: Kafka and Cassandra outlive the run, and a later run left
    them on one core."""
    cores = os.sched_getaffinity(0) | set(range(os.cpu_count() or 1))
    for row in stack.status():
        for task in Path(f"/proc/{row['pid']}/task").iterdir() if row.get("pid") else ():
            with contextlib.suppress(ProcessLookupError, OSError):
                os.sched_setaffinity(int(task.name), cores)


def pin(stack: Stack) -> dict[str, list[int]]:
    """The engines on the last core, everything else (the stack's other processes and this generator) on the
    others, so the admission policy is measured apart from CPU starvation. Every thread of each process is
    pinned (a thread started later inherits its creator's cores). Returns the cores each side got."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--pin needs at least 2 cores")
    engines, rest = {cores[-1]}, set(cores[:-1])
    for row in stack.status():
        pid = row.get("pid")
        if not pid:
            continue
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(task.name), engines if row["role"] == "engine" else rest)
    os.sched_setaffinity(0, rest)
    return {"engines": sorted(engines), "rest": sorted(rest)}
