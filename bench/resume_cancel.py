"""Resume latency, cancel latency and delta coalescing, on the real local stack (two edge replicas).

- Resume: a stream is dropped after a random number of tokens on replica 0 and resumed with its last
  `id:` as Last-Event-ID on replica 1; latency = reconnect request sent -> first replayed event received.
  Measured for live runs (resumed mid-generation) and for finished runs (resumed from a random cursor).
- Cancel: `POST .../cancel` after the third token; latency = cancel request sent -> the engine's slot is
  free (llama-server's /slots polled every 2 ms), and how many tokens the engine produced after the request
  (completion tokens reported minus tokens seen when cancelling; the stream is still in flight).
- Coalescing: completion tokens per token-delta record.

Runs its own stack under a fresh namespace and port base; prints JSON, writes bench/results/resume_cancel.json.
Usage: python bench/resume_cancel.py [--runs 20]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from measure import pct  # noqa: E402

from api.auth import credential  # noqa: E402
from infra.stack import Stack  # noqa: E402
from replay.sse import iter_sse  # noqa: E402

PORT_BASE = 19000
LONG = "Write a very long, detailed story about a lighthouse keeper and the sea."


def events(lines: Iterator[str], until_tokens: int | None = None) -> list[dict[str, Any]]:
    """SSE events from a response's line iterator (reading can go on later from the same iterator)."""
    found: list[dict[str, Any]] = []
    for event in iter_sse(lines):
        found.append(event)
        if until_tokens is not None and sum(e.get("event") == "token" for e in found) >= until_tokens:
            return found
    return found


def first_event_after(client: httpx.Client, url: str, cursor: str | None) -> float:
    """Milliseconds from sending the reconnect to receiving its first event."""
    headers = {"Last-Event-ID": cursor} if cursor else {}
    started = time.perf_counter()
    with client.stream("GET", url, headers=headers) as response:
        for line in response.iter_lines():
            if line.startswith("event:"):
                return (time.perf_counter() - started) * 1000
    raise RuntimeError("the resumed stream had no event")


def slots_busy(llama: str, headers: dict[str, str]) -> bool:
    return any(s.get("is_processing") for s in httpx.get(f"{llama}/slots", headers=headers, timeout=5).json())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()

    stack = Stack(namespace=f"b{uuid.uuid4().hex[:8]}", port_base=PORT_BASE, replicas=2)
    stack.up()
    try:
        token = credential("bench-resume", "pro", 30 * 86_400)
        auth = {"Authorization": f"Bearer {token}"}
        edge0 = httpx.Client(base_url=f"http://127.0.0.1:{PORT_BASE}", headers=auth, timeout=120)
        edge1 = httpx.Client(base_url=f"http://127.0.0.1:{PORT_BASE + 100}", headers=auth, timeout=120)
        llama, engine_key = stack.engine_url(), stack.engine_headers()
        skipped: list[str] = []
        live_ms, finished_ms, cancel_ms, after_cancel, per_record = [], [], [], [], []
        for _ in tqdm(range(args.runs), desc="resume (live runs)", file=sys.stderr):
            chat = edge0.post("/v1/chats").json()["id"]  # a fresh chat: the prompt stays one turn long
            body = {"content": LONG, "max_tokens": 96}
            with edge0.stream("POST", f"/v1/chats/{chat}/messages", json=body) as response:
                part = events(response.iter_lines(), until_tokens=random.randint(1, 8))
            run = part[0]["data"]["run_id"]
            url = f"/v1/chats/{chat}/runs/{run}/events"
            live_ms.append(first_event_after(edge1, url, part[-1]["id"]))
            with edge1.stream("GET", url) as response:  # the whole run, once it has finished
                whole = events(response.iter_lines())
            tokens = [e for e in whole if e["event"] == "token"]
            per_record.append(whole[-1]["data"]["usage"]["completion_tokens"] / max(1, len(tokens)))
            cursor = random.choice(whole[:-1])["id"]
            finished_ms.append(first_event_after(edge1, url, cursor))
        for _ in tqdm(range(args.runs), desc="cancel", file=sys.stderr):
            chat = edge0.post("/v1/chats").json()["id"]
            while slots_busy(llama, engine_key):
                time.sleep(0.05)
            with edge0.stream("POST", f"/v1/chats/{chat}/messages", json={"content": LONG, "max_tokens": 400}) as r:
                lines = r.iter_lines()
                part = events(lines, until_tokens=3)
                run = part[0]["data"]["run_id"]
                seen = 3
                started = time.perf_counter()
                answer = edge1.post(f"/v1/chats/{chat}/runs/{run}/cancel")
                if answer.status_code != 202:  # the model ended its answer before the cancel: not a sample
                    skipped.append(answer.text)
                    continue
                while slots_busy(llama, engine_key):
                    time.sleep(0.002)
                cancel_ms.append((time.perf_counter() - started) * 1000)
                rest = events(lines)
            done = rest[-1]["data"]
            assert done["finish_reason"] == "cancelled", done
            after_cancel.append(done["usage"]["completion_tokens"] - seen)
        result = {
            "benchmark": "resume_cancel",
            "runs": args.runs,
            "resume_live_ms": {"p50": pct(live_ms, 50, 2), "p99": pct(live_ms, 99, 2)},
            "resume_finished_ms": {"p50": pct(finished_ms, 50, 2), "p99": pct(finished_ms, 99, 2)},
            "cancel_to_slot_free_ms": {"p50": pct(cancel_ms, 50, 2), "p99": pct(cancel_ms, 99, 2)},
            "tokens_after_cancel_request": {"median": statistics.median(after_cancel), "max": max(after_cancel)},
            "tokens_per_delta_record": round(statistics.median(per_record), 2),
            "cancel_samples": len(cancel_ms),
            "cancels_refused_because_the_run_had_ended": skipped,
            "note": "one 2-core machine runs Kafka, Cassandra, every stage and the model; tokens after the cancel "
            "request include those already decoded but still in flight to the client when it was sent.",
        }
        print(json.dumps(result, indent=2))
        (ROOT / "bench" / "results" / "resume_cancel.json").write_text(json.dumps(result, indent=2) + "\n")
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
