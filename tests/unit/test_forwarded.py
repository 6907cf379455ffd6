"""The client behind a trusted proxy (api/forwarded.py): the forwarded address counts, from trusted proxies only,
and each forwarded address is limited like a direct client."""

import asyncio

import httpx

from api.forwarded import Forwarded, Networks


def edge(peer: str, release: asyncio.Event, seen: list[tuple[str, str]]) -> httpx.AsyncClient:
    async def app(scope, receive, send):
        seen.append((scope["client"][0], scope["scheme"]))
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    limited = Forwarded(app, Networks(["10.0.0.0/8", "127.0.0.2"]), max_per_client=2)
    transport = httpx.ASGITransport(app=limited, client=(peer, 5000))
    return httpx.AsyncClient(transport=transport, base_url="http://edge")


def test_networks_match_addresses_and_cidrs_and_nothing_else():
    trusted = Networks(["10.0.0.0/8", "127.0.0.2", "fd00::/8"])
    assert "10.200.3.4" in trusted and "127.0.0.2" in trusted and "fd00::1" in trusted
    assert "127.0.0.1" not in trusted and "11.0.0.1" not in trusted and "proxy" not in trusted
    assert "10.0.0.1" not in Networks([])


async def test_a_proxied_client_is_its_forwarded_address_and_is_limited_as_one():
    release, seen = asyncio.Event(), []
    async with edge("127.0.0.2", release, seen) as http:
        ada = {"X-Forwarded-For": "203.0.113.7, 10.0.0.9", "X-Forwarded-Proto": "https"}  # 10.x: another proxy
        held = [asyncio.create_task(http.get("/", headers=ada)) for _ in range(2)]
        bob = asyncio.create_task(http.get("/", headers={"X-Forwarded-For": "198.51.100.1"}))
        while len(seen) < 3:
            await asyncio.sleep(0.01)
        third = await http.get("/", headers=ada)  # ada's third at once: over her limit of 2
        assert third.status_code == 429 and third.headers["retry-after"] == "1"
        assert third.json()["error"]["code"] == "too_many_connections"
        release.set()
        assert [r.status_code for r in await asyncio.gather(*held, bob)] == [200, 200, 200]
    assert sorted(seen) == [("198.51.100.1", "http"), ("203.0.113.7", "https"), ("203.0.113.7", "https")]


async def test_forwarded_headers_from_an_untrusted_peer_are_ignored_and_not_limited_here():
    release, seen = asyncio.Event(), []
    release.set()
    async with edge("192.0.2.50", release, seen) as http:
        posing = {"X-Forwarded-For": "203.0.113.7", "X-Forwarded-Proto": "https"}
        answers = await asyncio.gather(*(http.get("/", headers=posing) for _ in range(3)))
    assert [r.status_code for r in answers] == [200, 200, 200]  # its connections are api/server.py's to count
    assert set(seen) == {("192.0.2.50", "http")}
