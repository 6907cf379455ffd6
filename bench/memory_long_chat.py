"""A scripted 200-turn conversation on the real stack: prompt tokens, TTFT and recall per turn, against naive
full history, all in one run.

    python bench/memory_long_chat.py [--turns 200] [--max-tokens 48]

Facts are planted at turns 3, 50 and 120; later turns ask about them (probes). A probe hits when the fact is
in the assembled prompt the model saw (the RunScheduled event's messages: verbatim window, summary or
retrieved messages), whatever the tiny model answers. Naive cost is the same conversation with its whole
stored history, counted with the same tokenizer. TTFT is split, over the turns sent after the first
summary was asked for, by whether a summary run was in flight when the turn was sent: none; one waiting for
a quiet engine (a background run gives way to every reply); or one running (started in a quiet moment, or
after waiting `background_patience_s`). Prints JSON and writes bench/results/memory_long_chat.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from measure import pct, summary
from tqdm import tqdm

from admission.limits import BACKGROUND_PRIORITY
from api.auth import credential
from conversation import tokens
from infra.stack import Stack
from processors.settings import ProcessorSettings
from replay.client import ChatClient
from runtime.settings import DEFAULT_POOLS
from safety.replay import events
from topics.pipeline import RUN_COMPLETED, RUN_SCHEDULED, Topic

FACTS = {
    3: ("My sister Ana lives in Porto and works as a marine biologist.", "Porto"),
    50: ("I drive a blue 1998 Volvo estate that I call Old Bertha.", "Volvo"),
    120: ("The code for my gym locker is 4417, please remember it.", "4417"),
}
PROBES = {  # turn -> (fact turn, question)
    10: (3, "Where does my sister live?"),
    60: (3, "What does my sister Ana do for work?"),
    75: (50, "What car do I drive?"),
    100: (50, "What colour is my car?"),
    130: (120, "What is my gym locker code?"),
    140: (3, "Remind me, which city is my sister in?"),
    150: (50, "What do I call my car?"),
    165: (120, "I forgot my locker code at the gym. What was it?"),
    180: (3, "What is my sister's name and job?"),
    190: (50, "How old is my car?"),
    195: (120, "Which number opens my locker?"),
    199: (3, "Where did I say Ana lives?"),
}
SUBJECTS = [
    "the printing press",
    "volcanoes",
    "sourdough bread",
    "chess openings",
    "the water cycle",
    "jazz music",
    "solar panels",
    "the Roman roads",
    "honey bees",
    "sailing knots",
    "the moon landing",
    "coral reefs",
    "electric guitars",
    "the Silk Road",
    "rain forests",
    "marathon training",
    "origami",
    "lighthouses",
    "glaciers",
    "the violin",
    "tea ceremonies",
    "desert plants",
    "bridges",
    "typewriters",
    "comets",
]
FORMS = [
    "Tell me something interesting about {}.",
    "How would you explain {} to a ten-year-old?",
    "What are two common misconceptions about {}?",
    "Give me a short history of {} in a few sentences.",
    "Why do people find {} fascinating?",
]


def script(turns: int, rng: random.Random) -> list[tuple[str, int | None]]:
    """(message, fact turn it probes or None) for turns 1..n."""
    out: list[tuple[str, int | None]] = []
    for turn in range(1, turns + 1):
        if turn in FACTS:
            out.append((FACTS[turn][0], None))
        elif turn in PROBES and PROBES[turn][0] < turn:
            out.append((PROBES[turn][1], PROBES[turn][0]))
        else:
            out.append((rng.choice(FORMS).format(rng.choice(SUBJECTS)), None))
    return out


def stream(client: httpx.Client, chat_id: str, content: str, max_tokens: int) -> tuple[float, str]:
    """(TTFT ms at the client, run id) of one turn."""
    run = ChatClient(client).send(chat_id, content, max_tokens=max_tokens)
    if run.status != 200:
        raise RuntimeError(f"{run.status}: {run.error}")
    ttft_s = run.ttft_s if run.ttft_s is not None else time.perf_counter() - run.started
    return ttft_s * 1000, run.run_id or ""


BOOTSTRAP = "127.0.0.1:9092"
BANDS = ((0, 20), (20, 50), (50, 100), (100, 150), (150, 200))  # turns, for the per-turn curves


def bands(values: list[float]) -> dict[str, dict[str, float]]:
    return {f"{lo + 1}-{hi}": summary(values[lo:hi]) for lo, hi in BANDS if values[lo:hi]}


def ratio(values: list[float], base: list[float]) -> float | None:
    return round(pct(values, 50) / pct(base, 50), 3) if values and base else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--port-base", type=int, default=28600)
    parser.add_argument("--think-ms", type=int, default=500)  # a user reads the answer before writing again
    args = parser.parse_args()
    rng = random.Random(7)
    plan = script(args.turns, rng)
    small = DEFAULT_POOLS["small"]
    counter = tokens.load(small.tokenizer)
    system = ProcessorSettings().system_prompt

    stack = Stack(namespace=f"bench{uuid.uuid4().hex[:6]}", port_base=args.port_base, workers={"small": 1, "large": 1})
    stack.up()
    try:
        user = credential("bench-memory", "enterprise", 30 * 86_400)
        api = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {user}"}, timeout=300)
        chat_id = api.post("/v1/chats", json={"title": "200 turns"}).json()["id"]
        sent: list[dict[str, Any]] = []
        for content, probes in tqdm(plan, desc="turns", mininterval=10):
            at = time.time() * 1000
            time.sleep(args.think_ms / 1000)
            ttft, run_id = stream(api, chat_id, content, args.max_tokens)
            sent.append({"run_id": run_id, "content": content, "probes": probes, "sent_at": at, "ttft_ms": ttft})
        time.sleep(3)

        def of_chat(topic: Topic) -> list[dict[str, Any]]:
            return [e for e in events(BOOTSTRAP, topic, stack.namespace) if e["prompt"]["chat_id"] == chat_id]

        scheduled = [run for topic in RUN_SCHEDULED.values() for run in of_chat(topic)]
        completed = of_chat(RUN_COMPLETED)
    finally:
        stack.stop()
        stack.forget()  # its topics and keyspace

    by_run = {r["prompt"]["run_id"]: r for r in scheduled}
    done = {d["prompt"]["run_id"]: d for d in completed}
    summaries = sorted((r for r in scheduled if r["prompt"]["summary"]), key=lambda r: r["scheduled_at"])
    waiting, running = ([], [])  # (from, to) ms: scheduled -> started, started -> ended, of each summary run
    for r in summaries:
        d = done.get(r["prompt"]["run_id"])
        end = d["completed_at"] if d else float("inf")
        start = end - d["duration_ms"] if d else float("inf")
        waiting.append((r["scheduled_at"], start))
        running.append((start, end))

    # naive cost: the whole stored history (answers as generated) before each turn
    naive_tokens, prompt_tokens, engine_tokens, cached, ttft, hits = [], [], [], [], [], []
    while_waiting, while_running, quiet, over_budget, pools = [], [], [], 0, {}
    messages: list[dict[str, str]] = [{"role": "system", "content": system}]
    for turn, item in enumerate(sent, start=1):
        run = by_run[item["run_id"]]
        result = done[item["run_id"]]
        naive_tokens.append(counter.count_chat([*messages, {"role": "user", "content": item["content"]}]))
        messages += [{"role": "user", "content": item["content"]}, {"role": "assistant", "content": result["content"]}]
        prompt_tokens.append(run["context"]["prompt_tokens"])
        over_budget += run["context"]["prompt_tokens"] > run["context"]["budget"]
        pools[run["pool"]] = pools.get(run["pool"], 0) + 1
        engine_tokens.append(result["usage"]["prompt_tokens"])
        cached.append(result["usage"]["cached_tokens"])
        ttft.append(item["ttft_ms"])
        if not waiting or item["sent_at"] < waiting[0][0]:
            pass  # before the first summary was asked for (no recall yet either): not comparable
        elif any(s <= item["sent_at"] <= e for s, e in running):
            while_running.append(item["ttft_ms"])
        elif any(s <= item["sent_at"] <= e for s, e in waiting):
            while_waiting.append(item["ttft_ms"])
        else:
            quiet.append(item["ttft_ms"])
        if item["probes"]:
            fact_text, key = FACTS[item["probes"]]
            seen = run["messages"]
            source = "missed"
            if any(key in m["content"] for m in seen[1:-1]):
                source = "verbatim"
            elif key in seen[0]["content"]:
                source = "summary"
            elif key in seen[-1]["content"].rsplit("\n\nNew message:\n", 1)[0] and run["context"]["retrieved_ids"]:
                source = "retrieved"
            hits.append({"turn": turn, "fact_turn": item["probes"], "key": key, "source": source})

    budget = small.prompt_budget
    hit_rate = sum(h["source"] != "missed" for h in hits) / len(hits) if hits else 0.0
    steady = prompt_tokens[len(prompt_tokens) // 2 :]
    result = {
        "benchmark": "memory_long_chat",
        "turns": len(sent),
        "max_tokens": args.max_tokens,
        "think_ms": args.think_ms,
        "turns_by_pool": pools,
        "small_pool_prompt_budget": budget,
        "small_pool_context": small.context,
        "max_prompt_tokens": max(prompt_tokens),
        "turns_over_their_pools_budget": over_budget,
        "prompt_tokens_equal_engine_count": sum(a == b for a, b in zip(prompt_tokens, engine_tokens, strict=True)),
        "prompt_tokens_by_band": bands(prompt_tokens),
        "prompt_tokens_second_half_spread": max(steady) - min(steady),
        "naive_tokens_by_band": bands(naive_tokens),
        "naive_turn_over_context": next(
            (i + 1 for i, n in enumerate(naive_tokens) if n + args.max_tokens > small.context), None
        ),
        "cost_tokens_assembled_total": sum(prompt_tokens),
        "cost_tokens_naive_total": sum(naive_tokens),
        "cost_ratio_naive_over_assembled": round(sum(naive_tokens) / sum(prompt_tokens), 2),
        "cost_ratio_last_50_turns": round(sum(naive_tokens[-50:]) / sum(prompt_tokens[-50:]), 2),
        "engine_cached_prompt_share": round(sum(cached) / max(1, sum(engine_tokens)), 3),
        "ttft_ms_by_band": bands(ttft),
        "ttft_ratio_last_50_over_first_50_p50": round(pct(ttft[-50:], 50) / pct(ttft[:50], 50), 3),
        "summary_runs": len(summaries),
        "summaries_in_prompts": len(
            {
                r["context"]["summary_version"]
                for r in by_run.values()
                if r["context"] and r["context"]["summary_version"]
            }
        ),
        "summaries_withheld_by_guard": len(
            {
                w
                for r in by_run.values()
                if r["context"]
                for w in r["context"]["withheld_ids"]
                if w.startswith("summary")
            }
        ),
        "summary_runs_by_outcome": {
            reason: sum(done.get(r["prompt"]["run_id"], {}).get("finish_reason") == reason for r in summaries)
            for reason in ("stop", "length", "cancelled", "content_filter")
        },
        "summary_runs_background_priority": sum(r["priority"] <= BACKGROUND_PRIORITY for r in summaries),
        "ttft_ms_no_summary": summary(quiet) if quiet else None,
        "ttft_ms_summary_waiting": summary(while_waiting) if while_waiting else None,
        "ttft_ms_summary_running": summary(while_running) if while_running else None,
        "ttft_ratio_summary_waiting_over_none_p50": ratio(while_waiting, quiet),
        "ttft_ratio_summary_running_over_none_p50": ratio(while_running, quiet),
        "probes": len(hits),
        "probe_hit_rate": round(hit_rate, 3),
        "probe_hits_by_source": {
            s: sum(h["source"] == s for h in hits) for s in ("verbatim", "summary", "retrieved", "missed")
        },
        "probe_hit_rate_by_fact_turn": {
            t: round(statistics.fmean(h["source"] != "missed" for h in hits if h["fact_turn"] == t), 3) for t in FACTS
        },
        "probe_detail": hits,
        "per_turn": {
            "prompt_tokens": prompt_tokens,
            "naive_tokens": naive_tokens,
            "ttft_ms": [round(t, 1) for t in ttft],
            "cached_tokens": cached,
        },
    }
    out = Path(__file__).parent / "results" / "memory_long_chat.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "per_turn"}, indent=2))


if __name__ == "__main__":
    main()
