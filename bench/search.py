"""Search on the real local stack (one edge, the metering stage holding the index in the embedded ClickHouse):

- freshness: a message with a word no other has is sent and answered (8 tokens), then searched for every 10 ms
  until found; from the answer's end (the stream's `completed`) and from the send, per message;
- latency through the edge, interleaved round by round so the machine's noise falls on all alike: a word
  search, a word as typed (prefix), a search by meaning (the query embedded in the stage, vectors scanned),
  beside the edge's plain read of the person's chat list (`GET /v1/chats`, Cassandra) as the baseline.

The person has the sent messages (about 2 x --messages rows); the latency at 100,000 messages of one person is
the store's (bench/search_store.py, the same queries). Prints JSON, writes bench/results/search.json.
Usage: python bench/search.py [--messages 30] [--rounds 60]
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
from replay.client import ChatClient  # noqa: E402

PORT_BASE = 19700
TOPICS = ("lighthouse keepers", "sourdough starters", "mountain railways", "tide pools", "jazz standards")


def freshness(http: httpx.Client, messages: int) -> dict[str, Any]:
    chats = ChatClient(http)
    chat = chats.new_chat(title="bench")
    after_answer: list[float] = []
    after_send: list[float] = []
    for i in tqdm(range(messages), desc="freshness", file=sys.stderr):
        word = f"zq{uuid.uuid4().hex[:8]}"
        sent = time.perf_counter()
        run = chats.send(chat, f"Tell me about {TOPICS[i % len(TOPICS)]}, note {word}.", max_tokens=8)
        answered = time.perf_counter()
        assert run.completed, run.error
        while not http.get("/v1/search", params={"q": f"{word} ", "mode": "words"}).json()["data"]:
            time.sleep(0.01)
        found = time.perf_counter()
        after_answer.append((found - answered) * 1000)
        after_send.append((found - sent) * 1000)
    return {
        "after_answer_ms": summary(after_answer),
        "after_send_ms": summary(after_send),
        "note": "polled every 10 ms; includes the metering stage's batch window (meter_batch_s 0.5 s)",
    }


def latency(http: httpx.Client, rounds: int) -> dict[str, Any]:
    ways: dict[str, tuple[str, dict[str, str]]] = {
        "words": ("/v1/search", {"q": "sourdough starters ", "mode": "words"}),
        "prefix_as_typed": ("/v1/search", {"q": "sourd", "mode": "words"}),
        "meaning": ("/v1/search", {"q": "baking bread with a starter", "mode": "meaning"}),
        "words_and_meaning": ("/v1/search", {"q": "sourdough bread"}),
        "baseline_chat_list": ("/v1/chats", {}),
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    found: dict[str, int] = {}
    for _ in tqdm(range(rounds), desc="latency", file=sys.stderr):
        for name, (path, params) in ways.items():
            started = time.perf_counter()
            response = http.get(path, params=params)
            times[name].append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, response.text
            found[name] = len(response.json()["data"])
    stats = {name: summary(values) for name, values in times.items()}
    floor = stats["baseline_chat_list"]["p50"]
    return {
        "ms": stats,
        "hits": found,
        "p50_over_baseline": {name: round(stats[name]["p50"] / floor, 2) for name in ways},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    result: dict[str, Any] = {"bench": "search", "date": time.strftime("%Y-%m-%d"), "messages": args.messages}
    stack = Stack(namespace=f"b{uuid.uuid4().hex[:8]}", port_base=PORT_BASE, replicas=1)
    stack.up()
    try:
        auth = {"Authorization": f"Bearer {credential(f'bench-{uuid.uuid4().hex[:6]}', 'enterprise')}"}
        with httpx.Client(base_url=stack.api_url, headers=auth, timeout=120) as http:
            result["freshness"] = freshness(http, args.messages)
            http.get("/v1/search", params={"q": "warm"})  # the stage's first query
            result["latency"] = latency(http, args.rounds)
    finally:
        stack.stop()
    text = json.dumps(result, indent=2)
    print(text)
    (ROOT / "bench" / "results" / "search.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
