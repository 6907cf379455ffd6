"""The edge serving HTTPS with a certificate from files (PARLEY_TLS_CERT_FILE, PARLEY_TLS_KEY_FILE: a mounted
Kubernetes TLS Secret's tls.crt and tls.key): a third edge replica of the suite's stack, started with them. The
refusals at start (one file, a mismatched key, a missing file): tests/unit/test_server_guards.py."""

import os
import signal
import ssl
import subprocess
import sys

import httpx

from tests.tools.certs import issue

from .conftest import PORT_BASE, wait_for


def test_an_edge_with_a_certificate_serves_https_only_and_never_logs_its_key(live, tmp_path):
    issued = issue(tmp_path / "tls")
    port = PORT_BASE + 300
    api = next(s for s in live.stack.services() if s.name == "api-0")
    env = {
        **os.environ,
        **api.env,
        "PARLEY_PORT": str(port),
        "PARLEY_TLS_CERT_FILE": str(issued.cert),
        "PARLEY_TLS_KEY_FILE": str(issued.key),
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "edge.log"
    with log.open("wb") as out:
        edge = subprocess.Popen([sys.executable, "-m", "api"], env=env, stdout=out, stderr=subprocess.STDOUT)
    trusted = ssl.create_default_context(cafile=str(issued.ca))
    url = f"https://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            try:
                return httpx.get(f"{url}/readyz", verify=trusted, timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_for(ready, 90), log.read_text()[-2000:]
        token = live.token()
        with httpx.Client(base_url=url, verify=trusted, headers={"Authorization": f"Bearer {token}"}) as client:
            assert client.get("/v1/me").json()["user_id"]
            assert client.post("/v1/chats").status_code == 201
        try:  # plain HTTP to the same port is not served
            plain = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code
        except httpx.HTTPError:
            plain = None
        assert plain in (None, 400)
        try:  # nor is a client that does not trust the certificate
            httpx.get(f"{url}/readyz", timeout=5)
            untrusted = True
        except httpx.ConnectError:
            untrusted = False
        assert not untrusted
    finally:
        edge.send_signal(signal.SIGTERM)
        edge.wait(timeout=30)
    text = log.read_text()
    assert "serving HTTPS with the certificate" in text
    assert issued.key.read_text().splitlines()[1] not in text
