"""The edge's own HTTP guards on a real uvicorn server (api/server.py, api/body_limit.py): a head that does not
arrive in time, a body that stops arriving, and one client holding too many connections."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request

from api import errors
from api.body_limit import BodyLimit
from api.forwarded import Networks
from api.server import GuardedH11, guarded

LIMIT = 4
PROXY = Networks(["127.0.0.2"])  # a trusted proxy: its connections carry many clients


@pytest.fixture(scope="module")
def server():
    app = FastAPI()
    errors.install(app)
    app.add_middleware(BodyLimit, max_bytes=10_000, idle_s=0.5)

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", http=guarded(0.5, LIMIT, PROXY))
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not running.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield port
    running.should_exit = True
    thread.join(10)


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))


def answer(conn: socket.socket) -> tuple[int, dict[str, str], dict]:
    """The next response on a connection: status, headers and JSON body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, content = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    while len(content) < int(headers.get("content-length", 0)):
        content += conn.recv(65536)
    return int(lines[0].split()[1]), headers, json.loads(content) if content else {}


def test_headers_that_do_not_arrive_in_time_get_a_408_and_the_connection_closed(server):
    with connect(server) as conn:
        conn.sendall(b"POST /echo HTTP/1.1\r\nHost: edge\r\n")  # and the rest never comes
        status, _, body = answer(conn)
    assert status == 408 and body["error"]["code"] == "request_timeout"
    with connect(server) as idle:  # nothing sent at all
        assert answer(idle)[0] == 408
    # a prompt client on a kept-alive connection is unaffected, request after request
    with httpx.Client(base_url=f"http://127.0.0.1:{server}") as client:
        for _ in range(3):
            assert client.post("/echo", content=b"x" * 10).json() == {"bytes": 10}
            time.sleep(0.2)


def test_a_body_that_stops_arriving_gets_a_408(server):
    with connect(server) as conn:
        # the other 90 bytes never come (the connection stays open)
        conn.sendall(b"POST /echo HTTP/1.1\r\nHost: edge\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        status, _, body = answer(conn)
    assert status == 408 and body["error"]["code"] == "request_timeout"


def test_one_client_holds_at_most_its_share_of_connections(server):
    held = [connect(server) for _ in range(LIMIT)]
    try:
        with connect(server) as extra:
            status, headers, body = answer(extra)
        assert status == 429 and headers["retry-after"] == "1"
        assert body["error"]["code"] == "too_many_connections"
    finally:
        for conn in held:
            conn.close()
    deadline = time.monotonic() + 5
    while GuardedH11.open_by_client and time.monotonic() < deadline:  # the server saw them go
        time.sleep(0.05)
    with httpx.Client(base_url=f"http://127.0.0.1:{server}") as client:
        assert client.post("/echo", content=b"ok").status_code == 200


def test_a_trusted_proxy_holds_more_connections_than_one_client_may(server):
    held = [connect(server, "127.0.0.2") for _ in range(LIMIT + 2)]
    try:
        for conn in held:
            conn.sendall(b"POST /echo HTTP/1.1\r\nhost: edge\r\ncontent-length: 2\r\n\r\nok")
        assert [answer(conn)[0] for conn in held] == [200] * (LIMIT + 2)
        assert "127.0.0.2" not in GuardedH11.open_by_client
    finally:
        for conn in held:
            conn.close()


def test_tls_loads_a_certificate_and_key_or_refuses_to_start_saying_which_file_and_never_the_key(tmp_path):
    """api/__main__.py tls: no files, plain HTTP; both, HTTPS; one alone, a key of another certificate, or a
    missing file, the edge refuses to start with a message naming the file and not its contents. Serving
    HTTPS itself: tests/stack/test_tls.py."""
    from api.__main__ import tls
    from api.settings import ApiSettings
    from tests.tools.certs import issue

    good, other = issue(tmp_path / "a"), issue(tmp_path / "b")
    assert tls(ApiSettings()) == {}
    assert tls(ApiSettings(tls_cert_file=str(good.cert), tls_key_file=str(good.key))) == {
        "ssl_certfile": str(good.cert),
        "ssl_keyfile": str(good.key),
    }
    secret = other.key.read_text().splitlines()[1]
    for cert, key, said in (
        (good.cert, "", "needs both"),
        (good.cert, other.key, "do not load"),
        (tmp_path / "missing.crt", good.key, "No such file"),
    ):
        with pytest.raises(SystemExit) as refused:
            tls(ApiSettings(tls_cert_file=str(cert), tls_key_file=str(key)))
        assert said in str(refused.value) and secret not in str(refused.value)
