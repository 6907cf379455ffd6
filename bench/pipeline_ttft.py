"""Pipeline-added time to first token, and the local stack's steady-state memory.

For each of N prompts, in random order, the same request goes (a) straight to the engine (llama-server's
/v1/chat/completions, same messages and max_tokens) and (b) through the whole pipeline (edge -> Kafka ->
moderation -> scheduling -> inference -> Kafka -> edge -> SSE). Pipeline-added TTFT = (b) - (a) per pair.
Before each pair the prompt is sent once to the engine, so both measurements find it in the engine's prompt
cache (llama-server reuses a slot's cached prefix; otherwise whichever goes second gains 40-140 ms), and
which of the two goes first is random per pair.

Runs its own stack under a fresh namespace and port base; prints JSON and writes bench/results/.
Usage: python bench/pipeline_ttft.py [--requests 100] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import json
import random
import time
import uuid
from pathlib import Path

import httpx
from measure import pct, summary
from tqdm import tqdm

from api.auth import credential
from infra.stack import Stack
from processors.settings import ProcessorSettings
from replay.sse import iter_sse

PROMPTS = [
    "Say hello.",
    "Name a fruit.",
    "What is two plus two?",
    "Give me a colour.",
    "Say something kind.",
    "Name an animal.",
    "What day comes after Monday?",
    "Name a planet.",
    "Say thanks in Spanish.",
    "Name a musical instrument.",
]


def engine_ttft(client: httpx.Client, url: str, messages: list[dict], max_tokens: int) -> float:
    """Same retry as the inference consumer's client: cpp-httplib closes a connection after 100 requests."""
    try:
        return _engine_ttft(client, url, messages, max_tokens)
    except httpx.RemoteProtocolError:
        return _engine_ttft(client, url, messages, max_tokens)


def _engine_ttft(client: httpx.Client, url: str, messages: list[dict], max_tokens: int) -> float:
    body = {
        "model": "smollm2-135m-instruct",
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0.7,
    }
    started = time.perf_counter()
    first = None
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        for sse in iter_sse(response.iter_lines()):  # read to the end, as the pipeline's consumer does
            if first is None and isinstance(chunk := sse.get("data"), dict):
                choices = chunk.get("choices") or [{}]
                if (choices[0].get("delta") or {}).get("content"):
                    first = time.perf_counter() - started
    if first is None:
        raise RuntimeError("engine produced no token")
    return first * 1000


def pipeline_ttft(client: httpx.Client, chat_id: str, content: str, max_tokens: int) -> float:
    started = time.perf_counter()
    first = None
    with client.stream(
        "POST", f"/v1/chats/{chat_id}/messages", json={"content": content, "max_tokens": max_tokens}
    ) as response:
        for sse in iter_sse(response.iter_lines()):
            if first is None and sse.get("event") == "token":
                first = time.perf_counter() - started
    if first is None:
        raise RuntimeError("pipeline produced no token")
    return first * 1000


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return 0.0


def stack_memory(stack: Stack) -> dict[str, float]:
    """Resident MB of every process of the stack as `parley status` lists them (brokers, Cassandra nodes, the
    pipeline's processes, each engine under its own row), and their total."""
    rows = {str(row["name"]): round(rss_mb(int(str(row["pid"]))), 1) for row in stack.status() if row["pid"]}
    rows["total"] = round(sum(rows.values()), 1)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--port-base", type=int, default=28000)
    args = parser.parse_args()

    stack = Stack(namespace=f"bench{uuid.uuid4().hex[:6]}", port_base=args.port_base)
    stack.up()
    try:
        token = credential("bench", "pro", 30 * 86_400)
        api = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=120)
        engine = httpx.Client(timeout=120, headers=stack.engine_headers())
        engine_url = stack.engine_url()
        system = ProcessorSettings().system_prompt
        rng = random.Random(7)
        for _ in range(3):  # warm-up, both paths
            chat = api.post("/v1/chats").json()["id"]
            pipeline_ttft(api, chat, "Hi.", args.max_tokens)
            engine_ttft(
                engine,
                engine_url,
                [{"role": "system", "content": system}, {"role": "user", "content": "Hi."}],
                args.max_tokens,
            )
        pairs = []
        for i in tqdm(range(args.requests), desc="pairs", unit="pair", mininterval=5):
            content = f"{PROMPTS[i % len(PROMPTS)]} ({i})"
            messages = [{"role": "system", "content": system}, {"role": "user", "content": content}]
            chat = api.post("/v1/chats").json()["id"]
            engine_ttft(engine, engine_url, messages, args.max_tokens)  # prime the prompt cache
            engine_first = rng.random() < 0.5
            if engine_first:
                e = engine_ttft(engine, engine_url, messages, args.max_tokens)
                p = pipeline_ttft(api, chat, content, args.max_tokens)
            else:
                p = pipeline_ttft(api, chat, content, args.max_tokens)
                e = engine_ttft(engine, engine_url, messages, args.max_tokens)
            pairs.append((p, e, engine_first))
        time.sleep(2)
        memory = stack_memory(stack)
    finally:
        stack.stop()

    added = [p - e for p, e, _ in pairs]
    result = {
        "benchmark": "pipeline_added_ttft",
        "requests": len(pairs),
        "max_tokens": args.max_tokens,
        "pipeline_ttft_ms": summary([p for p, _, _ in pairs]),
        "engine_ttft_ms": summary([e for _, e, _ in pairs]),
        "pipeline_added_ttft_ms": summary(added),
        "added_when_engine_first_ms": summary([p - e for p, e, f in pairs if f]),
        "added_when_pipeline_first_ms": summary([p - e for p, e, f in pairs if not f]),
        "ratio_pipeline_to_engine_p50": round(pct([p for p, _, _ in pairs], 50) / pct([e for _, e, _ in pairs], 50), 2),
        "stack_rss_mb": memory,
        "stack_start_s": stack.timings,
    }
    out = Path(__file__).parent / "results" / "pipeline_ttft.json"
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
