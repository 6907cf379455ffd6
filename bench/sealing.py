"""What sealing each person's text with their own key costs, and how long erasing a person takes.

1. Pipeline-added time to first token with sealing off and on, side by side: two stacks run at once (one with
   PARLEY_SEAL_TEXT=false), and the pairs of bench/pipeline_ttft.py (the same request straight to the stack's
   engine and through its pipeline, engine prompt cache primed, order random) alternate between them in
   random order, so both see the same machine at the same moments.
2. The codec alone: encoding and decoding a scheduled run with a long context and a token delta, with the
   sealed stack's keyring and without keys, in this process.
3. Erasure of a person with 10,000 messages (100 chats of 100, written as the persistence stage writes them,
   after one real turn that made their data key): the time DELETE /v1/me takes, and until the stages have
   deleted every message row (read directly).

Prints JSON and writes bench/results/sealing.json.
Usage: python bench/sealing.py [--pairs 150] [--messages 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
from measure import pct, summary  # noqa: E402
from pipeline_ttft import engine_ttft, pipeline_ttft  # noqa: E402
from tqdm import tqdm  # noqa: E402

from api.auth import credential  # noqa: E402
from infra.stack import Stack  # noqa: E402
from processors.settings import ProcessorSettings  # noqa: E402
from registry import client as registry  # noqa: E402
from runtime import keys  # noqa: E402
from storage.conversations import Conversations  # noqa: E402
from storage.ids import new_id  # noqa: E402
from storage.rows import Message  # noqa: E402
from storage.session import connect_session  # noqa: E402
from topics import codec  # noqa: E402
from topics.records import token_delta  # noqa: E402

PROMPTS = ["Say hello.", "Name a fruit.", "What is two plus two?", "Name a planet.", "Say thanks in Spanish."]


def ttft_pairs(stacks: dict[str, Stack], pairs: int, max_tokens: int) -> dict[str, list[float]]:
    token = credential("bench-seal", "pro", 86_400)
    system = ProcessorSettings().system_prompt
    clients = {
        mode: (
            httpx.Client(base_url=s.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=120),
            httpx.Client(timeout=120, headers=s.engine_headers()),
            s.engine_url(),
        )
        for mode, s in stacks.items()
    }
    for api, engine, url in clients.values():  # warm-up, both paths of both stacks
        for _ in range(3):
            pipeline_ttft(api, api.post("/v1/chats").json()["id"], "Hi.", max_tokens)
            engine_ttft(
                engine, url, [{"role": "system", "content": system}, {"role": "user", "content": "Hi."}], max_tokens
            )
    rng = random.Random(11)
    added: dict[str, list[float]] = {mode: [] for mode in stacks}
    for i in tqdm(range(pairs), desc="pairs per mode", unit="pair"):
        content = f"{PROMPTS[i % len(PROMPTS)]} ({i})"
        messages = [{"role": "system", "content": system}, {"role": "user", "content": content}]
        for mode in rng.sample(list(stacks), len(stacks)):
            api, engine, url = clients[mode]
            chat = api.post("/v1/chats").json()["id"]
            engine_ttft(engine, url, messages, max_tokens)  # prime the prompt cache
            if rng.random() < 0.5:
                e = engine_ttft(engine, url, messages, max_tokens)
                p = pipeline_ttft(api, chat, content, max_tokens).ttft_ms
            else:
                p = pipeline_ttft(api, chat, content, max_tokens).ttft_ms
                e = engine_ttft(engine, url, messages, max_tokens)
            added[mode].append(p - e)
    return added


def codec_cost(rounds: int) -> dict[str, object]:
    """Microseconds per encode + decode of two record types, keys on (the codec's current ones) and off."""
    held = codec._keys
    passage = "The lighthouse keeper wrote down the tides every morning. " * 30  # ~1,700 characters
    prompt = {
        "event_id": str(uuid.uuid4()),
        "run_id": str(new_id()),
        "chat_id": str(new_id()),
        "user_id": "bench-codec",
        "tier": "pro",
        "message_id": str(new_id()),
        "content": "What did the keeper write down?",
        "max_tokens": 64,
        "reply_partition": 0,
        "created_at": int(time.time() * 1000),
    }
    scheduled = {
        "event_id": str(uuid.uuid4()),
        "prompt": prompt,
        "pool": "small",
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": passage}, {"role": "assistant", "content": passage[:400]}] * 2,
        "scheduled_at": int(time.time() * 1000),
    }
    delta = token_delta(scheduled, 5, "delta", text=" the tides every")  # type: ignore[arg-type]
    out: dict[str, object] = {}
    for name, schema, record in (("run_scheduled", "RunScheduled", scheduled), ("token_delta", "TokenDelta", delta)):
        times: dict[str, float] = {}
        for mode, ring in (("off", None), ("on", held), ("off_again", None)):
            codec.use_keys(ring)
            samples = []
            for _ in range(rounds):
                started = time.perf_counter()
                codec.decode(schema, codec.encode(schema, record))
                samples.append((time.perf_counter() - started) * 1e6)
            times[mode] = statistics.median(samples)
        codec.use_keys(held)
        size = len(codec.encode(schema, record))
        codec.use_keys(None)
        plain = len(codec.encode(schema, record))
        codec.use_keys(held)
        out[name] = {
            "encode_decode_us_p50": {k: round(v, 1) for k, v in times.items()},
            "added_us_p50": round(times["on"] - (times["off"] + times["off_again"]) / 2, 1),
            "bytes": {"off": plain, "on": size},
        }
    return out


def erasure(stack: Stack, messages: int) -> dict[str, object]:
    person = f"bench-erase-{uuid.uuid4().hex[:6]}"
    api = httpx.Client(
        base_url=stack.api_url, headers={"Authorization": f"Bearer {credential(person, 'pro', 3600)}"}, timeout=600
    )
    chats = [api.post("/v1/chats").json()["id"] for _ in range(max(1, messages // 100))]
    pipeline_ttft(api, chats[0], "Say hello.", 4)  # a real turn: their data key, and records in the log
    settings = stack.settings
    session = connect_session(settings.cassandra)
    store = Conversations(session, settings.keyspace_name, "persistence")
    per_chat = messages // len(chats)

    async def fill() -> None:
        for chat in tqdm(chats, desc="writing messages", unit="chat"):
            now = datetime.now(UTC)
            rows = [
                Message(str(new_id()), "user" if i % 2 == 0 else "assistant", f"Message {i} of a long history.", now)
                for i in range(per_chat)
            ]
            await asyncio.gather(*(store.put_message(uuid.UUID(chat), m) for m in rows))

    asyncio.run(fill())

    def left() -> int:
        return sum(
            session.execute(
                f"SELECT count(*) FROM {settings.keyspace_name}.messages WHERE chat_id = %s", (uuid.UUID(c),)
            ).one()[0]
            for c in chats
        )

    written = left()
    started = time.perf_counter()
    answer = api.delete("/v1/me")
    route_s = time.perf_counter() - started
    while left():
        time.sleep(0.5)
    rows_s = time.perf_counter() - started
    session.cluster.shutdown()
    return {
        "messages": written,
        "chats": len(chats),
        "status": answer.status_code,
        "data_keys_deleted": answer.json().get("data_keys"),
        "route_s": round(route_s, 2),
        "until_every_message_row_gone_s": round(rows_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=150)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()

    tag = uuid.uuid4().hex[:6]
    stacks = {
        "off": Stack(namespace=f"seal0{tag}", port_base=28000, overrides={"PARLEY_SEAL_TEXT": "false"}),
        "on": Stack(namespace=f"seal1{tag}", port_base=30000),
    }
    try:
        for s in stacks.values():
            s.up()
        registry.connect(stacks["on"].registry_url)
        keyring = keys.start(stacks["on"].settings, "api", creates=True)
        added = ttft_pairs(stacks, args.pairs, args.max_tokens)
        codec_us = codec_cost(args.rounds)
        erased = erasure(stacks["on"], args.messages)
        if keyring is not None:
            keyring.stop()
    finally:
        for s in stacks.values():
            s.stop()
            s.forget()
    p50 = {mode: pct(v, 50) or 0.0 for mode, v in added.items()}
    result = {
        "benchmark": "sealing",
        "pairs_per_mode": args.pairs,
        "pipeline_added_ttft_ms": {mode: summary(v) for mode, v in added.items()},
        "sealing_added_ttft_p50_ms": round(p50["on"] - p50["off"], 2),
        "ratio_on_to_off_p50": round(p50["on"] / p50["off"], 3) if p50["off"] else None,
        "codec": codec_us,
        "erasure": erased,
    }
    out = Path(__file__).parent / "results" / "sealing.json"
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
