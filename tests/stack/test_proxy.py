"""Behind a trusted proxy, more than 64 people stream at once: the suite's edges trust 127.0.0.2 as a proxy
(PARLEY_TRUSTED_PROXIES, tests/stack/conftest.py), and a client connecting from that address is one proxy
carrying many people, each named by X-Forwarded-For. From anywhere else the header is ignored. One person is
still held to their own number of open streams, wherever they connect from (PARLEY_MAX_STREAMS_PER_PERSON: the
suite's edges allow 80)."""

import asyncio
import threading

import httpx

from replay.client import ChatClient
from replay.sse import aiter_sse

from .conftest import wait_for

PEOPLE = 70  # more than the 64 connections one address may hold
PER_PERSON = 80  # the suite's PARLEY_MAX_STREAMS_PER_PERSON
LONG = "Write a very long, detailed story about a lighthouse keeper and the sea."


async def hold_streams(
    base: str, headers: dict[str, str], path: str, people: int, expected: int | None = None
) -> list[int]:
    """`people` streams of the run through the proxy address, each held open until `expected` (all) have an
    event; a stream refused answers its status."""
    expected = people if expected is None else expected
    transport = httpx.AsyncHTTPTransport(local_address="127.0.0.2", limits=httpx.Limits(max_connections=None))
    everyone_in = asyncio.Event()
    opened: list[int] = []

    async def one(i: int, http: httpx.AsyncClient) -> int:
        forwarded = {**headers, "X-Forwarded-For": f"10.1.{i // 250}.{i % 250 + 1}"}
        async with http.stream("GET", path, headers=forwarded) as response:
            if response.status_code != 200:
                return response.status_code
            async for _ in aiter_sse(response.aiter_lines()):
                opened.append(i)
                if len(opened) == expected:
                    everyone_in.set()
                await asyncio.wait_for(everyone_in.wait(), 60)  # all open at once
                return 200
        return 0

    async with httpx.AsyncClient(base_url=base, transport=transport, timeout=60) as http:
        return list(await asyncio.gather(*(one(i, http) for i in range(people))))


def open_streams(client) -> float:
    """The replica's open SSE streams, from its /metrics."""
    line = next(x for x in client.get("/metrics").text.splitlines() if x.startswith("parley_edge_open_streams "))
    return float(line.split()[1])


def test_more_than_64_people_behind_one_proxy_stream_at_once(live):
    client = live.client(live.token())
    chats = ChatClient(client)
    chat = chats.new_chat()
    started = threading.Event()
    run_ids: list[str] = []

    def answer():
        chats.send(
            chat, LONG, max_tokens=1500, when=lambda r: True, then=lambda r: run_ids.append(r.run_id) or started.set()
        )

    reader = threading.Thread(target=answer)
    reader.start()
    assert started.wait(60)
    path = f"/v1/chats/{chat}/runs/{run_ids[0]}/events"
    statuses = asyncio.run(hold_streams(str(client.base_url), dict(client.headers), path, PEOPLE))
    assert statuses == [200] * PEOPLE, sorted(set(statuses))
    # one person over their own number of streams is refused the next, from any address (once the streams
    # above are closed: only the answer's own is left)
    assert wait_for(lambda: open_streams(client) == 1), open_streams(client)
    over = asyncio.run(hold_streams(str(client.base_url), dict(client.headers), path, PER_PERSON + 1, PER_PERSON))
    assert sorted(over) == [200] * PER_PERSON + [429], sorted(set(over))
    chats.cancel(chat, run_ids[0])
    reader.join(60)
    assert wait_for(lambda: client.get(f"/v1/chats/{chat}").json()["active_run_id"] is None)
