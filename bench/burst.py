"""A burst against the default local stack: how fast every rejection comes, and whether a pro user sending at
the same time is admitted and served (issue 25).

200 requests from 10 free users, each with a client of its own, 63 in flight at a time (6 or 7 per user: the
edge takes 64 connections from one address; the 64th is the pro user's) (POST /v1/chats/{chat}/messages,
200-token answers, each in a chat of its own made before the burst), and one pro user sending "Say hi." a
second into it. Reports the 429s' decision latency (request to status line) p50/p99 and their codes, every
other status, and the pro user's status, decision latency and time to first token. Repeats the burst
`--rounds` times on one stack (each round with fresh free users, so budgets start full) and reports each round
and all rounds together.

Prints JSON and writes bench/results/burst.json. Usage: python bench/burst.py [--rounds 2]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from measure import summary  # noqa: E402

from api.auth import credential  # noqa: E402
from infra.stack import Stack  # noqa: E402
from infra.traces import spans  # noqa: E402
from replay.client import AsyncChatClient  # noqa: E402

REQUESTS, USERS, IN_FLIGHT, MAX_TOKENS, PRO_AFTER_S = 200, 10, 63, 200, 1.0
QUESTION = "Write a long story about a lighthouse keeper and the sea, with many details."


def chats(client: httpx.AsyncClient, token: str) -> AsyncChatClient:
    return AsyncChatClient(client, headers={"Authorization": f"Bearer {token}"})


async def new_chat(client: httpx.AsyncClient, token: str) -> str:
    return await chats(client, token).new_chat(title="burst")


async def send(client: httpx.AsyncClient, token: str, chat: str, content: str, max_tokens: int) -> dict[str, Any]:
    """One message: status, decision time (request to status line), TTFT, error code."""
    try:
        run = await chats(client, token).send(chat, content, max_tokens=max_tokens)
    except httpx.HTTPError as exc:
        return {"status": 0, "code": type(exc).__name__}
    out: dict[str, Any] = {"decided_ms": run.headers_s * 1000, "status": run.status}
    if run.ttft_s is not None:
        out["ttft_ms"] = run.ttft_s * 1000
    if run.code:
        out["code"] = run.code
    return out


async def burst(url: str, round_no: int) -> dict[str, Any]:
    """Every user with a client of their own, as every user has a browser of their own. One client driving all
    64 connections spent most of its time in its own pool: httpcore checks every pooled connection (a
    getpeername each) for every request it places, so a rejection's time at the client grew with the number of
    connections the bench held, not with the edge (py-spy of the bench: 23% of its samples in has_expired)."""
    free = [credential(f"burst{round_no}-free{i}", "free", 3600) for i in range(USERS)]
    pro = credential(f"burst{round_no}-pro", "pro", 3600)
    # The edge takes at most 64 connections from one client address (api/server.py): 63 free requests are in
    # flight at once, 6 or 7 per free user (so the clients never hold more than 63 connections between them),
    # and the 64th connection is the pro user's.
    shares = [IN_FLIGHT // USERS + (i < IN_FLIGHT % USERS) for i in range(USERS)] + [1]
    clients = [httpx.AsyncClient(base_url=url, timeout=300, limits=httpx.Limits(max_connections=n)) for n in shares]
    try:
        return await _burst(clients[:USERS], clients[USERS], free, pro, shares)
    finally:
        await asyncio.gather(*(client.aclose() for client in clients))


async def _burst(
    clients: list[httpx.AsyncClient], pro_client: httpx.AsyncClient, free: list[str], pro: str, shares: list[int]
) -> dict[str, Any]:
    gates = [asyncio.Semaphore(n) for n in shares[:USERS]]  # a request waits here, outside its timing

    async def made_chat(i: int) -> str:
        async with gates[i % USERS]:
            return await new_chat(clients[i % USERS], free[i % USERS])

    # The chats are made before the burst: the burst is messages only.
    chats = await asyncio.gather(*(made_chat(i) for i in range(REQUESTS)))
    pro_chat = await new_chat(pro_client, pro)

    async def one(i: int) -> dict[str, Any]:
        async with gates[i % USERS]:
            return await send(clients[i % USERS], free[i % USERS], chats[i], f"{QUESTION} ({i})", MAX_TOKENS)

    async def pro_user() -> dict[str, Any]:
        await asyncio.sleep(PRO_AFTER_S)
        return await send(pro_client, pro, pro_chat, "Say hi.", 16)

    *free_results, pro_result = await asyncio.gather(*(one(i) for i in range(REQUESTS)), pro_user())
    return {"free": free_results, "pro": pro_result}


def report(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    free = [r for rnd in rounds for r in rnd["free"]]
    rejected = [r for r in free if r.get("status") == 429]
    return {
        "requests": len(free),
        "statuses": dict(Counter(str(r.get("status")) for r in free)),
        "codes": dict(Counter(r.get("code") for r in free if r.get("code"))),
        "rejection_ms": summary([r["decided_ms"] for r in rejected]),
        "admitted_decision_ms": summary([r["decided_ms"] for r in free if r.get("status") == 200]),
        "pro": [rnd["pro"] for rnd in rounds],
    }


def edge_spans(stack: Stack) -> dict[str, Any]:
    """The edge's own time for the chat-message requests it answered 429 (its server spans, from the collector's
    file): the part of a rejection's latency spent in the handler, not in transit, in the server's accept queue
    or in the clients (the bench's 11 clients run on the cores the stack runs on)."""
    took = [
        (int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])) / 1e6
        for span in spans(stack.spans_file)
        if span["name"] == "POST /v1/chats/{chat_id}/messages"
        and str(span["attrs"].get("http.response.status_code") or span["attrs"].get("http.status_code")) == "429"
    ]
    return {"rejection_ms": summary(took), "warm_up_included": True}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--port-base", type=int, default=29000)
    args = parser.parse_args()
    stack = Stack(namespace=f"burst{uuid.uuid4().hex[:6]}", port_base=args.port_base)
    stack.up()
    try:
        asyncio.run(burst(stack.api_url, -1))  # warm-up round, not reported (first connections, first runs)
        rounds = [asyncio.run(burst(stack.api_url, n)) for n in range(args.rounds)]
        time.sleep(3)  # the collector writes its batches
        server = edge_spans(stack)
    finally:
        stack.stop()
    result = {
        "benchmark": "burst",
        "shape": {"requests": REQUESTS, "users": USERS, "in_flight": IN_FLIGHT, "max_tokens": MAX_TOKENS},
        "all_rounds": report(rounds),
        "edge_handler": server,
        "rounds": [report([r]) for r in rounds],
    }
    text = json.dumps(result, indent=2)
    (ROOT / "bench" / "results" / "burst.json").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
