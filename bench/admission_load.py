"""Admission control under overload, and fairness, on the real local stack with two replicas of every stage.

- Capacity: completed runs per second with the small pool saturated (closed loop of pro clients).
- Unloaded: pro TTFT with one request at a time (the baseline of the same run).
- Overload: open-loop arrivals at 1x, 2x, 5x and 10x capacity, half free and half pro users, for a fixed
  time each: admitted throughput, TTFT p50/p99 per tier, how fast rejections come (p50/p99), degraded runs,
  and budget overspend (free users get a small budget with no refill, so budgets bind).
- Fairness: 10 pro users, nine with two requests in flight each and one flooding with many; each user's
  share of the tokens served, and Jain's index over the nine.

The stack: two edge replicas, two of moderation, scheduling and persistence (metering: one, chdb is
single-process), two inference consumers (engines) per pool. Prints JSON, writes bench/results/admission.json.
Usage: python bench/admission_load.py [--phase-s 20]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine_floor import engine_floor  # noqa: E402
from measure import pct  # noqa: E402
from procstat import cores_used, cpu_seconds, pin, unpin  # noqa: E402

from api.auth import credential  # noqa: E402
from infra.stack import Stack  # noqa: E402
from replay.client import AsyncChatClient, Run  # noqa: E402

PORT_BASE = 19200
MAX_TOKENS = 32
FREE_BUDGET = 2_000  # tokens, no refill: binds during the bench


@functools.cache
def token(user: str, tier: str, admin: bool = False) -> str:
    return credential(user, tier, 3600, admin)


class Clients:
    """One HTTP client (and connection pool) per user: httpx scans its whole pool on every request, which
    with hundreds of connections in one pool cost the generator most of a core at 10x (py-spy)."""

    def __init__(self) -> None:
        self._clients: dict[str, httpx.AsyncClient] = {}

    def __call__(self, user: str) -> httpx.AsyncClient:
        if user not in self._clients:
            # idle connections are dropped before uvicorn's 5 s keep-alive ends, or a request can race its close
            limits = httpx.Limits(max_connections=200, keepalive_expiry=3.0)
            self._clients[user] = httpx.AsyncClient(timeout=300, limits=limits)
        return self._clients[user]

    async def __aenter__(self) -> Clients:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.gather(*(c.aclose() for c in self._clients.values()))


async def new_chat(clients: Clients, url: str, user: str, tier: str) -> str:
    headers = {"Authorization": f"Bearer {token(user, tier)}"}
    for attempt in range(3):
        try:
            return str((await clients(user).post(f"{url}/v1/chats", headers=headers)).json()["id"])
        except httpx.TransportError:
            if attempt == 2:
                raise
            await asyncio.sleep(0.5)
    raise AssertionError("unreachable")


async def one(
    clients: Clients, url: str, user: str, tier: str, content: str, chat: str | None = None
) -> dict[str, Any]:
    """One chat message (in a new chat unless one is given); a dropped connection is recorded (status 0)."""
    try:
        return await _one(clients(user), url, user, tier, content, chat or await new_chat(clients, url, user, tier))
    except httpx.HTTPError as exc:
        return {"user": user, "tier": tier, "status": 0, "code": type(exc).__name__, "decided_ms": 0.0}


async def _one(client: httpx.AsyncClient, url: str, user: str, tier: str, content: str, chat: str) -> dict[str, Any]:
    """One chat message: decision latency, TTFT, tokens, outcome."""
    headers = {"Authorization": f"Bearer {token(user, tier)}"}
    started_at: list[float] = []

    def started(run: Run) -> None:
        started_at.append(time.perf_counter() - run.started)

    chats = AsyncChatClient(client, base=url, headers=headers)
    run = await chats.send(chat, content, max_tokens=MAX_TOKENS, when=lambda r: "run.started" in r.names, then=started)
    out: dict[str, Any] = {"user": user, "tier": tier, "decided_ms": run.headers_s * 1000, "status": run.status}
    if run.code:
        out["code"] = run.code
    if run.status != 200:
        return out
    queued = next((e["data"] for e in run.events if e.get("event") == "run.queued"), None)
    if queued is not None:
        out["degraded"] = queued.get("degraded_from") is not None
    if started_at:
        out["started_ms"] = started_at[0] * 1000
    if run.ttft_s is not None:
        out["ttft_ms"] = run.ttft_s * 1000
    if (done := run.completed) is not None:
        usage = done["usage"]
        out["tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        out["completion_tokens"] = usage["completion_tokens"]
    return out


def content(i: int) -> str:
    return f"Request {i}: name {random.randint(2, 5)} animals that live in the sea."


async def closed_loop(clients: Clients, urls, users, seconds: float, per_user: int) -> list[dict]:
    """Each user keeps `per_user` requests in flight until time is up."""
    results: list[dict] = []
    deadline = time.monotonic() + seconds

    async def loop(user: str, tier: str, k: int) -> None:
        i = 0
        while time.monotonic() < deadline:
            results.append(await one(clients, urls[k % len(urls)], user, tier, content(i)))
            i += 1
            if results[-1]["status"] != 200:
                await asyncio.sleep(0.2)

    await asyncio.gather(*(loop(u, t, k) for u, t, n in users for k in range(n)))
    return results


async def open_loop(clients: Clients, urls, rate: float, seconds: float, users: list[tuple[str, str]]) -> list[dict]:
    """Poisson arrivals at `rate` per second, each from the next user in turn, in a chat made beforehand (so
    an arrival is one request). Arrival times are fixed in advance: a late wake-up sends at once, so the
    offered rate holds as long as the generator keeps up on average (it reports what it really offered)."""
    arrivals, at = [], 0.0
    while at < seconds:
        arrivals.append(at)
        at += random.expovariate(rate)
    sem = asyncio.Semaphore(32)

    async def chat_for(i: int) -> str:
        async with sem:
            user, tier = users[i % len(users)]
            return await new_chat(clients, urls[i % len(urls)], user, tier)

    chats = await asyncio.gather(*(chat_for(i) for i in range(len(arrivals))))
    tasks = []
    print(f"offering {rate:.1f}/s for {seconds:.0f}s", file=sys.stderr)
    start = time.monotonic()
    for i, at in enumerate(arrivals):
        delay = start + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        user, tier = users[i % len(users)]
        tasks.append(asyncio.create_task(one(clients, urls[i % len(urls)], user, tier, content(i), chats[i])))
    offered_s = time.monotonic() - start
    results = list(await asyncio.gather(*tasks))
    for r in results:
        r["offered_s"] = offered_s
    return results


def summarise(results: list[dict]) -> dict[str, Any]:
    seconds = max(r["offered_s"] for r in results)
    ok = [r for r in results if r["status"] == 200 and "tokens" in r]
    refused = [r for r in results if r["status"] not in (0, 200)]
    out: dict[str, Any] = {
        "offered": len(results),
        "offered_per_s": round(len(results) / seconds, 2),
        "admitted_completed": len(ok),
        "admitted_per_s": round(len(ok) / seconds, 2),
        "rejected": len(refused),
        "rejected_by_code": {c: sum(r.get("code") == c for r in refused) for c in {r.get("code") for r in refused}},
        "rejection_ms_p50": pct([r["decided_ms"] for r in refused], 50, 1),
        "rejection_ms_p99": pct([r["decided_ms"] for r in refused], 99, 1),
        "degraded": sum(bool(r.get("degraded")) for r in ok),
        "failed_after_admission": sum(1 for r in results if r["status"] == 200 and "tokens" not in r),
        "transport_errors": sum(1 for r in results if r["status"] == 0),
    }
    for tier in ("free", "pro"):
        mine = [r["ttft_ms"] for r in ok if r["tier"] == tier and "ttft_ms" in r]
        out[f"{tier}_admitted"] = len(mine)
        out[f"{tier}_rejected"] = sum(r["tier"] == tier for r in refused)
        out[f"{tier}_ttft_ms_p50"] = pct(mine, 50, 1)
        out[f"{tier}_ttft_ms_p99"] = pct(mine, 99, 1)
        # where an admitted run's TTFT goes: request -> admitted (the stream opens) -> its engine starts it
        # (queue) -> first token (prefill)
        mine_ok = [r for r in ok if r["tier"] == tier and "ttft_ms" in r and "started_ms" in r]
        for part, values in (
            ("decision", [r["decided_ms"] for r in mine_ok]),
            ("queue", [r["started_ms"] - r["decided_ms"] for r in mine_ok]),
            ("prefill", [r["ttft_ms"] - r["started_ms"] for r in mine_ok]),
        ):
            out[f"{tier}_{part}_ms_p50"] = pct(values, 50, 1)
            out[f"{tier}_{part}_ms_p99"] = pct(values, 99, 1)
    return out


async def run(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    urls = [stack.api_url, f"http://127.0.0.1:{stack.port_base + 100}"]
    async with Clients() as clients:
        admin = {"Authorization": f"Bearer {token('bench-admin', 'pro', admin=True)}"}
        response = await clients("bench-admin").put(
            f"{urls[0]}/v1/admin/limits/tiers/free",
            headers=admin,
            json={"budget_tokens": FREE_BUDGET, "refill_tokens_per_hour": 0},
        )
        response.raise_for_status()
        tag = uuid.uuid4().hex[:6]
        for i in tqdm(range(6), desc="warm-up", file=sys.stderr):
            await one(clients, urls[i % 2], f"warm-{tag}", "pro", content(i))

        print("capacity ...", file=sys.stderr)
        pros = [(f"cap-{tag}-{i}", "pro", 4) for i in range(6)]  # 24 in flight > 16 slots
        for user, _, _ in pros:  # what the engines complete with every slot busy: these users may queue
            lift = {"max_queue_wait_s": 60, "max_concurrent": 8}
            url = f"{urls[0]}/v1/admin/limits/users/{user}"
            lifted = await clients("bench-admin").put(url, headers=admin, json=lift)
            lifted.raise_for_status()
        await asyncio.sleep(1)
        saturated = await closed_loop(clients, urls, pros, args.phase_s, 1)
        capacity = sum(1 for r in saturated if "tokens" in r) / args.phase_s
        print(f"capacity {capacity:.2f} runs/s", file=sys.stderr)

        unloaded = [await one(clients, urls[i % 2], f"solo-{tag}", "pro", content(i)) for i in range(args.solo)]
        solo = [r["ttft_ms"] for r in unloaded if "ttft_ms" in r]
        baseline = {"pro_ttft_ms_p50": pct(solo, 50, 1), "pro_ttft_ms_p99": pct(solo, 99, 1), "samples": len(solo)}
        print(f"unloaded pro TTFT {baseline}", file=sys.stderr)

        print("engine floor ...", file=sys.stderr)
        floor = await engine_floor(stack, args.solo, content)
        # The pipeline's unloaded pro p99 plus what a busy engine adds: the least its loaded p99 can be.
        extra = floor["busy_ttft_ms"]["p99"] - floor["idle_ttft_ms"]["p99"]
        floor["least_pro_p99_vs_unloaded"] = round(
            (baseline["pro_ttft_ms_p99"] + extra) / baseline["pro_ttft_ms_p99"], 2
        )
        print(f"engine floor {floor}", file=sys.stderr)

        users = [(f"free-{tag}-{i}", "free") for i in range(20)] + [(f"pro-{tag}-{i}", "pro") for i in range(20)]
        random.shuffle(users)
        overload: dict[str, Any] = {}
        every: list[dict] = []
        for factor in tqdm(args.factors, desc="overload", file=sys.stderr):
            before, started = cpu_seconds(stack), time.perf_counter()
            results = await open_loop(clients, urls, capacity * factor, args.phase_s, users)
            busy = cores_used(before, cpu_seconds(stack), time.perf_counter() - started)
            every += results
            overload[f"{factor}x"] = summarise(results) | {
                "target_per_s": round(capacity * factor, 2),
                "cores_used_by": busy,  # where the CPU went during the phase (its requests' tails included)
            }
            p99 = overload[f"{factor}x"]["pro_ttft_ms_p99"]
            if p99 is not None and baseline["pro_ttft_ms_p99"]:
                overload[f"{factor}x"]["pro_p99_ttft_vs_unloaded_p99"] = round(p99 / baseline["pro_ttft_ms_p99"], 2)
            await asyncio.sleep(3)

        spent: dict[str, int] = {}
        for r in every:
            spent[r["user"]] = spent.get(r["user"], 0) + r.get("tokens", 0)
        free_users = [u for u, t in users if t == "free"]
        overspend = {u: max(0, spent.get(u, 0) - FREE_BUDGET) for u in free_users}

        print("fairness ...", file=sys.stderr)
        fair_users = [(f"fair-{tag}-{i}", "pro", 2) for i in range(9)] + [(f"flood-{tag}", "pro", 16)]
        fair = await closed_loop(clients, urls, fair_users, args.fair_s, 1)
        served = {u: sum(r.get("completion_tokens", 0) for r in fair if r["user"] == u) for u, _, _ in fair_users}
        total = sum(served.values()) or 1
        shares = {u: round(v / total, 3) for u, v in served.items()}
        normal = [served[u] for u, _, n in fair_users if n == 2]
        jain = sum(normal) ** 2 / (len(normal) * sum(x * x for x in normal)) if any(normal) else None
        flood_requests = [r for r in fair if r["user"] == f"flood-{tag}"]

    return {
        "stack": {"edge_replicas": 2, "processor_replicas": 2, "metering_replicas": 1, "consumers_per_pool": 2},
        "max_tokens": MAX_TOKENS,
        "phase_s": args.phase_s,
        "capacity_runs_per_s": round(capacity, 2),
        "unloaded": baseline,
        "engine_floor": floor,
        "overload": overload,
        "budget": {
            "free_budget_tokens": FREE_BUDGET,
            "free_users": len(free_users),
            "max_tokens_spent_by_a_free_user": max(spent.get(u, 0) for u in free_users),
            "overspend_tokens_max": max(overspend.values()),
            "users_over_budget": sum(1 for v in overspend.values() if v > 0),
        },
        "fairness": {
            "users": 10,
            "flooder_in_flight_attempted": 16,
            "others_in_flight_each": 2,
            "share_of_completion_tokens": shares,
            "flooder_share": shares[f"flood-{tag}"],
            "mean_other_share": round(statistics.mean(shares[u] for u, _, n in fair_users if n == 2), 3),
            "jain_index_others": round(jain, 3) if jain else None,
            "flooder_requests": len(flood_requests),
            "flooder_rejected": sum(r["status"] != 200 for r in flood_requests),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase-s", type=float, default=20.0)
    parser.add_argument("--fair-s", type=float, default=30.0)
    parser.add_argument("--solo", type=int, default=40)
    parser.add_argument("--factors", type=float, nargs="+", default=[1, 2, 5, 10])
    parser.add_argument("--pin", action="store_true", help="engines on one core, the rest on the others")
    args = parser.parse_args()
    random.seed(5)
    stack = Stack(
        namespace=f"bench{uuid.uuid4().hex[:6]}",
        port_base=PORT_BASE,
        replicas=2,
        stages=2,
        workers={"small": 2, "large": 2},
    )
    stack.up()
    try:
        pinned = pin(stack) if args.pin else None
        result = {"pinned_cores": pinned} | asyncio.run(run(stack, args))
    finally:
        if args.pin:
            unpin(stack)
        stack.stop()
        stack.forget()  # its topics and keyspace
    text = json.dumps(result, indent=2)
    print(text)
    (ROOT / "bench" / "results" / ("admission_pinned.json" if args.pin else "admission.json")).write_text(text + "\n")


if __name__ == "__main__":
    main()
