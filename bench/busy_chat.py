"""A busy chat's answer, and what one run per chat costs, on the real local stack (two edge replicas).

- Quiet: one chat answering a long message, and a second message sent into it: request sent -> its 409's
  status line, beside a plain read of the same chat (GET /v1/chats/{chat}) at the same moment.
- Busy: 10 users send 20 messages each into one chat of theirs, all at once, 64 requests in flight: how each
  is answered (status and code) and how fast (request sent -> status line), p50/p99 per outcome.
- Baseline, the same run: the same 200 requests, each into a chat of its own (nothing busy).
- Compare-and-set: the chat's latest run is now changed by a lightweight transaction (`open_run`); its latency
  beside the plain write it replaced, on the same Cassandra, the same number of times, one at a time.

Prints JSON, writes bench/results/busy_chat.json. Usage: python bench/busy_chat.py [--users 10 --per-chat 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from measure import summary  # noqa: E402

from api.auth import credential  # noqa: E402
from infra.stack import Stack  # noqa: E402
from runtime.settings import StackSettings  # noqa: E402
from storage import schema  # noqa: E402

PORT_BASE = 19300
IN_FLIGHT = 64


async def one(http: httpx.AsyncClient, auth: dict[str, str], chat: str, text: str) -> dict[str, Any]:
    """Status, code and the milliseconds to the status line of one message."""
    started = time.perf_counter()
    body = {"content": text, "max_tokens": 8}
    try:
        async with http.stream("POST", f"/v1/chats/{chat}/messages", json=body, headers=auth) as response:
            answered_ms = (time.perf_counter() - started) * 1000
            raw = await response.aread()
    except httpx.HTTPError as exc:
        return {"status": 0, "code": type(exc).__name__, "answered_ms": (time.perf_counter() - started) * 1000}
    code = "" if response.status_code == 200 else json.loads(raw)["error"]["code"]
    return {"status": response.status_code, "code": code, "answered_ms": answered_ms}


async def scenario(base: str, users: int, per_chat: int, shared: bool, desc: str) -> dict[str, Any]:
    """One client (its pool at most IN_FLIGHT connections: the edge allows 64 per address), users' requests."""
    auth = {
        f"busy-{desc}-{i}": {"Authorization": f"Bearer {credential(f'busy-{desc}-{i}', 'enterprise', 3600)}"}
        for i in range(users)
    }
    limits = httpx.Limits(max_connections=IN_FLIGHT, max_keepalive_connections=IN_FLIGHT)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as http:
        jobs: list[tuple[str, str, str]] = []
        for user, headers in auth.items():
            made = [
                (await http.post("/v1/chats", headers=headers)).json()["id"] for _ in range(1 if shared else per_chat)
            ]
            jobs += [(user, made[0 if shared else n], f"Say the number {n}.") for n in range(per_chat)]
        gate = asyncio.Semaphore(IN_FLIGHT)
        bar = tqdm(total=len(jobs), desc=desc, file=sys.stderr)

        async def limited(user: str, chat: str, text: str) -> dict[str, Any]:
            async with gate:
                try:
                    return await one(http, auth[user], chat, text)
                finally:
                    bar.update()

        results = await asyncio.gather(*(limited(*job) for job in jobs))
        bar.close()
    outcomes = Counter(f"{r['status']} {r['code']}".strip() for r in results)
    by_outcome = {
        outcome: summary([r["answered_ms"] for r in results if f"{r['status']} {r['code']}".strip() == outcome])
        for outcome in outcomes
    }
    return {"requests": len(results), "outcomes": dict(outcomes), "answered_ms": by_outcome}


async def quiet(base: str, times: int) -> dict[str, Any]:
    """A second message into a chat that is answering, with nothing else going on, beside a plain read."""
    auth = {"Authorization": f"Bearer {credential('busy-quiet', 'enterprise', 3600)}"}
    refused_ms, read_ms, codes = [], [], Counter()
    async with httpx.AsyncClient(base_url=base, timeout=120, headers=auth) as http:
        for _ in tqdm(range(times), desc="quiet", file=sys.stderr):
            chat = (await http.post("/v1/chats")).json()["id"]
            long = {"content": "Write a very long story about the sea.", "max_tokens": 400}
            async with http.stream("POST", f"/v1/chats/{chat}/messages", json=long) as first:
                run = first.headers["x-run-id"]
                lines = first.aiter_lines()
                while "token" not in await anext(lines):
                    pass
                started = time.perf_counter()
                second = await http.post(f"/v1/chats/{chat}/messages", json={"content": "And?", "max_tokens": 4})
                refused_ms.append((time.perf_counter() - started) * 1000)
                codes[f"{second.status_code} {second.json()['error']['code']}"] += 1
                started = time.perf_counter()
                await http.get(f"/v1/chats/{chat}")
                read_ms.append((time.perf_counter() - started) * 1000)
                await http.post(f"/v1/chats/{chat}/runs/{run}/cancel")
                async for _ in lines:
                    pass
    refused, read = summary(refused_ms), summary(read_ms)
    return {
        "outcomes": dict(codes),
        "answered_ms": refused,
        "plain_read_ms": read,
        "ratio_p50": round(refused["p50"] / read["p50"], 2),
    }


def compare_and_set(namespace: str, times: int) -> dict[str, Any]:
    """The latest-run compare-and-set beside the plain write it replaced, alternated, one at a time."""
    settings = StackSettings(namespace=namespace).cassandra
    session = schema.connect(settings)
    ks = settings.keyspace
    cas = session.prepare(f"UPDATE {ks}.chats SET last_run_id = ? WHERE chat_id = ? IF user_id = ? AND last_run_id = ?")
    plain = session.prepare(
        f"UPDATE {ks}.chats SET last_active_at = toTimestamp(now()), last_run_id = ? WHERE chat_id = ?"
    )
    chat = uuid.uuid1()
    session.execute(f"INSERT INTO {ks}.chats (chat_id, user_id, title) VALUES (%s, 'bench', 'cas')", (chat,))
    latest: str | None = None
    cas_ms, plain_ms = [], []
    for _ in tqdm(range(times), desc="compare-and-set", file=sys.stderr):
        run = str(uuid.uuid1())
        started = time.perf_counter()
        assert session.execute(cas, (run, chat, "bench", latest)).one()[0]
        cas_ms.append((time.perf_counter() - started) * 1000)
        latest = run
        started = time.perf_counter()
        session.execute(plain, (str(uuid.uuid1()), uuid.uuid1()))
        plain_ms.append((time.perf_counter() - started) * 1000)
    session.cluster.shutdown()
    cas_s, plain_s = summary(cas_ms), summary(plain_ms)
    return {
        "compare_and_set_ms": cas_s,
        "plain_write_ms": plain_s,
        "ratio_p50": round(cas_s["p50"] / plain_s["p50"], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--per-chat", type=int, default=20)
    parser.add_argument("--cas-times", type=int, default=300)
    parser.add_argument("--quiet", type=int, default=20, help="second messages into an answering chat, alone")
    args = parser.parse_args()
    stack = Stack(namespace=f"b{uuid.uuid4().hex[:8]}", port_base=PORT_BASE, replicas=2)
    stack.up()
    try:
        base = stack.api_url
        alone = asyncio.run(quiet(base, args.quiet))
        busy = asyncio.run(scenario(base, args.users, args.per_chat, True, "one chat per user"))
        baseline = asyncio.run(scenario(base, args.users, args.per_chat, False, "one chat per request"))
        result = {
            "users": args.users,
            "per_chat": args.per_chat,
            "in_flight": IN_FLIGHT,
            "quiet_busy_chat": alone,
            "busy_chats": busy,
            "baseline_one_chat_per_request": baseline,
            "latest_run_write": compare_and_set(stack.namespace, args.cas_times),
        }
        print(json.dumps(result, indent=2))
        (ROOT / "bench" / "results" / "busy_chat.json").write_text(json.dumps(result, indent=2) + "\n")
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
