"""The engines' own share of a loaded TTFT, without the pipeline (bench/admission_load.py's floor): requests
straight to an engine, idle and with its other slots decoding."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
from measure import pct

from infra.stack import POOL_SLOTS, Stack
from replay.client import AsyncChatClient, Run, first_token


async def engine_ttft(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], text: str, to_end: bool = False, max_tokens: int = 32
) -> float | None:
    """A chat request straight to an engine (llama-server): its TTFT in ms. Read to its end (`to_end`: a
    request keeping a slot busy) or closed at its first token (its slot is freed as the engine notices).
    Sent again once when the engine closed a pooled connection (cpp-httplib does after 100 requests)."""
    try:
        return await _engine_ttft(client, url, headers, text, to_end, max_tokens)
    except httpx.RemoteProtocolError:
        return await _engine_ttft(client, url, headers, text, to_end, max_tokens)


async def _engine_ttft(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], text: str, to_end: bool, max_tokens: int
) -> float | None:
    engine = AsyncChatClient(client, base=url, headers=headers)
    stop = None if to_end else hang_up
    run = await engine.complete([{"role": "user", "content": text}], max_tokens=max_tokens, when=first_token, then=stop)
    return run.ttft_s * 1000 if run.ttft_s is not None else None


def hang_up(run: Run) -> bool:
    return True


async def engine_floor(stack: Stack, n: int, content: Callable[[int], str]) -> dict[str, Any]:
    """The engine's own share of a loaded pro TTFT, without the pipeline: short requests straight to the small
    pool's first engine, one at a time, with every engine idle, then with each engine decoding one request fewer
    than its slots (the state overload leaves the engines in: a pro run admitted first still shares its
    engine's batch and core with the runs already decoding, as llama-server does not preempt). p99 busy over
    p99 idle is the least the pipeline's pro p99 ratio can be at saturation, whatever its admission policy."""
    engines = [
        (pool, stack.engine_url(pool, i), stack.engine_headers(pool, i))
        for pool, count in stack.workers.items()
        for i in range(count)
    ]
    _, url, headers = engines[0]
    stop = asyncio.Event()
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=400)) as client:
        idle = [await engine_ttft(client, url, headers, content(i)) for i in range(n)]

        async def keep_busy(u: str, h: dict[str, str], k: int) -> None:
            i = 0
            while not stop.is_set():
                await engine_ttft(client, u, h, content(1000 * k + i), to_end=True)
                i += 1

        busy_slots = {pool: POOL_SLOTS.get(pool, 4) - 1 for pool in stack.workers}
        slots = [(u, h) for pool, u, h in engines for _ in range(busy_slots[pool])]
        background = [asyncio.create_task(keep_busy(u, h, k)) for k, (u, h) in enumerate(slots)]
        await asyncio.sleep(3)  # every slot decoding
        busy = [await engine_ttft(client, url, headers, content(i)) for i in range(n)]
        stop.set()
        await asyncio.gather(*background)
    idle_ms = [t for t in idle if t is not None]
    busy_ms = [t for t in busy if t is not None]
    floor = {
        "engines": len(engines),
        "busy_slots_per_engine": busy_slots,
        "idle_ttft_ms": {"p50": pct(idle_ms, 50, 1), "p99": pct(idle_ms, 99, 1)},
        "busy_ttft_ms": {"p50": pct(busy_ms, 50, 1), "p99": pct(busy_ms, 99, 1)},
    }
    floor["busy_p99_vs_idle_p99"] = round(floor["busy_ttft_ms"]["p99"] / floor["idle_ttft_ms"]["p99"], 2)
    return floor
