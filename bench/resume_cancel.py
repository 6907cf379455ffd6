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
from pathlib import Path

import httpx
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from measure import pct  # noqa: E402

from api.auth import credential  # noqa: E402
from infra.stack import Stack  # noqa: E402
from replay.client import ChatClient, Run  # noqa: E402

PORT_BASE = 19000
LONG = "Write a very long, detailed story about a lighthouse keeper and the sea."


def hang_up(run: Run) -> bool:
    return True


def first_event_after(chats: ChatClient, chat: str, run: str | None, cursor: str | None) -> float:
    """Milliseconds from sending the reconnect to receiving its first event."""
    resumed = chats.resume(chat, run or "", cursor, when=lambda r: True, then=hang_up)
    if resumed.first_s is None:
        raise RuntimeError("the resumed stream had no event")
    return resumed.first_s * 1000


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
        chats0, chats1 = ChatClient(edge0), ChatClient(edge1)
        llama, engine_key = stack.engine_url(), stack.engine_headers()
        skipped: list[str] = []
        live_ms, finished_ms, cancel_ms, after_cancel, per_record = [], [], [], [], []
        for _ in tqdm(range(args.runs), desc="resume (live runs)", file=sys.stderr):
            chat = chats0.new_chat()  # a fresh chat: the prompt stays one turn long
            stop = random.randint(1, 8)
            part = chats0.send(chat, LONG, max_tokens=96, when=lambda r, stop=stop: r.tokens >= stop, then=hang_up)
            run = part.run_id
            live_ms.append(first_event_after(chats1, chat, run, part.last_id))
            whole = chats1.resume(chat, run)  # the whole run, once it has finished
            per_record.append(whole.usage["completion_tokens"] / max(1, whole.tokens))
            cursor = random.choice(whole.events[:-1])["id"]
            finished_ms.append(first_event_after(chats1, chat, run, cursor))
        for _ in tqdm(range(args.runs), desc="cancel", file=sys.stderr):
            chat = chats0.new_chat()
            while slots_busy(llama, engine_key):
                time.sleep(0.05)
            measured: list[float] = []

            def cancel(run: Run, measured: list[float] = measured, chat: str = chat) -> bool:
                """At the third token: cancel on the other replica, time it to the engine's slot free, read on."""
                started = time.perf_counter()
                answer = chats1.cancel(chat, run.run_id or "")
                if answer.status_code != 202:  # the model ended its answer before the cancel: not a sample
                    skipped.append(answer.text)
                    return True
                while slots_busy(llama, engine_key):
                    time.sleep(0.002)
                measured.append((time.perf_counter() - started) * 1000)
                return False

            cancelled = chats0.send(chat, LONG, max_tokens=400, when=lambda r: r.tokens >= 3, then=cancel)
            if not measured:
                continue
            cancel_ms += measured
            done = cancelled.completed
            assert done is not None and done["finish_reason"] == "cancelled", cancelled.events[-1:]
            after_cancel.append(done["usage"]["completion_tokens"] - 3)
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
