"""How long a backup and a restore of 100,000 messages take, and how big the backup is.

A stack of its own is filled with 100 people, each with 10 chats of 100 messages (100,000 messages of ordinary
length, written as the persistence stage writes them) and a usage row for every answer (50,000, written through
the metering stage as it stores them). Then, with the real CLI:

- `parley backup` (every kept table read, each person's text sealed with their key, gzipped), beside the
  baseline of the same run: reading every row of the same tables through the driver and nothing else, the floor
  of any logical backup;
- `parley restore` onto a fresh keyspace and a fresh ClickHouse engine folder (the same registry: its ids are
  the schemas' own, so registering them again is what a fresh registry does too).

Prints JSON and writes bench/results/backup.json.
Usage: python bench/backup.py [--people 100] [--chats 10] [--per-chat 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
from tqdm import tqdm  # noqa: E402

from api.auth import credential  # noqa: E402
from infra.stack import Stack  # noqa: E402
from storage import backup  # noqa: E402
from storage.clickhouse import iso  # noqa: E402
from storage.conversations import Conversations  # noqa: E402
from storage.ids import new_id  # noqa: E402
from storage.rows import Message  # noqa: E402
from storage.schema import drop_keyspace  # noqa: E402
from storage.session import connect_session  # noqa: E402

SAID = (
    "Could you help me plan a week of dinners for a family of four, with one vegetarian night and nothing that "
    "takes more than forty minutes on a weekday?"
)


def fill(stack: Stack, people: int, chats: int, per_chat: int) -> dict[str, int]:
    """Chats through the edge (their rows as the edge writes them), messages as persistence writes them, a usage
    row per answer through the metering stage."""
    settings = stack.settings
    session = connect_session(settings.cassandra)
    store = Conversations(session, settings.keyspace_name, "persistence")
    usage: list[dict[str, object]] = []
    made: list[tuple[str, str]] = []
    for p in tqdm(range(people), desc="people and their chats", unit="person"):
        user = f"bench-backup-{p}"
        with httpx.Client(
            base_url=stack.api_url, headers={"Authorization": f"Bearer {credential(user, 'pro', 3600)}"}
        ) as api:
            made += [
                (user, api.post("/v1/chats", json={"title": f"Dinners, week {c}"}).json()["id"]) for c in range(chats)
            ]

    async def messages() -> None:
        for user, chat in tqdm(made, desc="writing messages", unit="chat"):
            now = datetime.now(UTC)
            rows = []
            for i in range(per_chat):
                answer = i % 2 == 1
                rows.append(Message(str(new_id()), "assistant" if answer else "user", f"{SAID} ({i})", now))
                if answer:
                    usage.append(
                        {
                            "run_id": str(uuid.uuid4()),
                            "event_id": str(uuid.uuid4()),
                            "user_id": user,
                            "tier": "pro",
                            "chat_id": chat,
                            "kind": "chat",
                            "model": "smollm2-135m-instruct",
                            "pool": "small",
                            "prompt_tokens": 120,
                            "completion_tokens": 80,
                            "cached_tokens": 40,
                            "ttft_ms": 95.5,
                            "itl_p50_ms": 9.1,
                            "itl_p99_ms": 20.2,
                            "queue_ms": 1.0,
                            "duration_ms": 900.0,
                            "finish_reason": "stop",
                            "moderation": "passed",
                            "cost_usd": "0.000012",
                            "created_at": iso(int(time.time() * 1000)),
                        }
                    )
            await asyncio.gather(*(store.put_message(uuid.UUID(chat), m) for m in rows))

    asyncio.run(messages())
    metering = f"http://127.0.0.1:{stack.port_base + 13}"
    with httpx.Client(base_url=metering, headers=settings.internal_headers(), timeout=300) as pages:
        for start in tqdm(range(0, len(usage), 1000), desc="usage rows", unit="1,000"):
            pages.post("/usage-repair", json={"rows": usage[start : start + 1000]}).raise_for_status()
    session.cluster.shutdown()
    return {"people": people, "chats": len(made), "messages": len(made) * per_chat, "usage_rows": len(usage)}


def read_floor(stack: Stack) -> float:
    """Seconds to read every row of the tables a backup keeps, through the driver, and do nothing with them."""
    settings = stack.settings
    session = connect_session(settings.cassandra)
    started = time.perf_counter()
    for table, kept in backup.CASSANDRA.items():
        if kept is not None:
            for _ in backup.cassandra_rows(session, settings.keyspace_name, table):
                pass
    seconds = time.perf_counter() - started
    session.cluster.shutdown()
    return seconds


def cli(stack: Stack, *args: str, env: dict[str, str] | None = None) -> tuple[float, dict]:
    argv = [sys.executable, "-m", "infra.cli", *args, "--port-base", str(stack.port_base)]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False)
    seconds = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return seconds, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--people", type=int, default=100)
    parser.add_argument("--chats", type=int, default=10)
    parser.add_argument("--per-chat", type=int, default=100)
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:6]
    stack = Stack(namespace=f"bk{tag}", port_base=30000)
    target = f"bk{tag}r"
    folder = Path(tempfile.mkdtemp(prefix="parley-bench-backup-")) / "taken"
    engine = tempfile.mkdtemp(prefix="parley-bench-restore-")
    try:
        stack.up()
        filled = fill(stack, args.people, args.chats, args.per_chat)
        floor_s = read_floor(stack)
        backup_s, taken = cli(stack, "backup", str(folder), "--namespace", stack.namespace)
        floor_again_s = read_floor(stack)  # the floor on either side of the backup: the machine is shared
        restore_s, restored = cli(
            stack,
            "restore",
            str(folder),
            "--namespace",
            target,
            "--registry-url",
            stack.registry_url,
            env={"PARLEY_USAGE_URL": f"chdb://{engine}"},
        )
    finally:
        stack.stop()
        stack.forget()
        drop_keyspace(stack.settings.model_copy(update={"namespace": target}).cassandra)
    floor = (floor_s + floor_again_s) / 2
    result = {
        "benchmark": "backup",
        "filled": filled,
        "backup_s": round(backup_s, 2),
        "read_floor_s": [round(floor_s, 2), round(floor_again_s, 2)],
        "backup_to_read_floor": round(backup_s / floor, 2),
        "backup_bytes": taken["bytes"],
        "backup_bytes_per_message": round(taken["bytes"] / filled["messages"], 1),
        "restore_s": round(restore_s, 2),
        "restored_messages": restored["cassandra"]["messages"],
        "restored_usage_rows": restored["clickhouse"]["usage"],
        "rows": taken["rows"],
    }
    out = Path(__file__).parent / "results" / "backup.json"
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
