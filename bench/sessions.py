"""What a browser session costs a request, on the real local stack: GET /v1/models (a route that reads no store
itself) signed in by a session cookie (one Cassandra read of the session row, plus its renewal every
PARLEY_SESSION_CHECK_S), beside the same request
signed in by an API key (one Cassandra read of the key) and by a development token (no read: the baseline),
interleaved round by round so the machine's noise falls on all three alike.

Prints JSON, writes bench/results/sessions.json. Usage: python bench/sessions.py [--rounds 400]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from measure import summary  # noqa: E402

from api.auth import credential  # noqa: E402
from infra.stack import Stack  # noqa: E402

PORT_BASE = 19400


def timed(http: httpx.Client, headers: dict[str, str]) -> float:
    started = time.perf_counter()
    response = http.get("/v1/models", headers=headers)
    elapsed = (time.perf_counter() - started) * 1000
    assert response.status_code == 200, response.text
    return elapsed


def measure(base: str, rounds: int) -> dict[str, Any]:
    user = f"bench-session-{uuid.uuid4().hex[:6]}"
    token = credential(user, "pro", 3600)
    with httpx.Client(base_url=base, timeout=30) as http:
        signed = http.post("/auth/token", json={"token": token})
        cookie = {"Cookie": signed.headers["set-cookie"].split(";", 1)[0]}
        key = http.post("/v1/api-keys", headers={"Authorization": f"Bearer {token}"}).json()["key"]
        ways = {
            "session": cookie,
            "api_key": {"Authorization": f"Bearer {key}"},
            "dev_token": {"Authorization": f"Bearer {token}"},
        }
        for headers in ways.values():  # warm each path
            for _ in range(20):
                timed(http, headers)
        times: dict[str, list[float]] = {name: [] for name in ways}
        for _ in tqdm(range(rounds), desc="rounds", file=sys.stderr):
            for name, headers in ways.items():
                times[name].append(timed(http, headers))
    out: dict[str, Any] = {name: summary(values) for name, values in times.items()}
    base_p50 = out["dev_token"]["p50"]
    out["p50_vs_dev_token"] = {name: round(out[name]["p50"] / base_p50, 2) for name in ("session", "api_key")}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=400)
    args = parser.parse_args()
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "rounds": args.rounds}
    stack = Stack(namespace=f"b{uuid.uuid4().hex[:8]}", port_base=PORT_BASE, replicas=1)
    stack.up()
    try:
        result["models_ms"] = measure(stack.api_url, args.rounds)
    finally:
        stack.stop()
    print(json.dumps(result, indent=2))
    (ROOT / "bench" / "results" / "sessions.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
