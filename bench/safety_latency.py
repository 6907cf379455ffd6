"""Safety latency: what moderation costs a prompt, an output window, and the time to first token.

1. Per-prompt check (the moderation stage's work: encoder + three heads + rules + policy), p50/p99, on a mix
   of prompt lengths, in this process.
2. Per output window (what an inference consumer checks every 32 tokens: the new text plus 400 characters
   before it), p50/p99.
3. On a real stack, pairs of the same request with and without moderation, in random order per pair: "with"
   runs under the built-in policy, "without" under a policy with no rules (the stages still run and hand
   off, but no classifier is called). Reported: TTFT and inter-token gap of each, the median of the per-pair
   differences, and the stage's own check time from the PromptModerated events. Requests are sent one at a
   time with a pause between them (--think-ms, as a user reads an answer before writing the next): without
   it, the work that follows an answer under the policy (its last output window, its screening for the
   next prompt's context) overlaps the next request and is counted against whichever mode comes next.

Prints JSON and writes bench/results/safety_latency.json.
Usage: python bench/safety_latency.py [--pairs 40] [--max-tokens 48] [--checks-only]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import uuid
from pathlib import Path

import httpx
from measure import pct, summary
from tqdm import tqdm

from api.auth import credential
from api.settings import ApiSettings
from infra.stack import Stack
from replay.client import ChatClient
from safety.moderator import Moderator
from safety.output import CONTEXT_CHARS, WINDOWS_PER_CHECK
from safety.policy import BUILTIN
from topics.codec import Event

SENTENCES = [
    "Can you explain how photosynthesis works in simple terms?",
    "I am planning a trip to Lisbon in May and would like a three-day itinerary.",
    "Write a short poem about the sea at night.",
    "What are the main differences between Python lists and tuples?",
    "My manager asked me to summarise the quarterly report; here are the key numbers.",
    "Translate the following paragraph into French, keeping the tone informal.",
]
# Short turns with dates, times and distances ("3rd", "10am", "5km"): words that mix digits and letters, which
# the plain reading once took for leetspeak (a second encoder pass for every such turn).
DATED = [
    "Can we move the call to the 3rd at 10am?",
    "Is the 2nd of June a good day for a 5km run?",
    "Remind me that the train leaves at 7pm on the 21st.",
    "What should I pack for a 3-day hike of 40km?",
]
ANSWER = (
    "Photosynthesis is the process plants use to turn light into chemical energy. In the leaves, chlorophyll "
    "absorbs sunlight, which splits water into oxygen and hydrogen; the hydrogen and carbon dioxide from the "
    "air are then built into sugars in the Calvin cycle. The oxygen is released through the stomata. "
)


def prompts(rng: random.Random, n: int) -> list[tuple[str, str]]:
    """(bucket, text): short turns, a paragraph, and long pasted documents."""
    out = []
    for _ in range(n):
        bucket = rng.choices(["short", "paragraph", "document"], weights=[6, 3, 1])[0]
        count = {"short": 1, "paragraph": 4, "document": 40}[bucket]
        out.append((bucket, " ".join(rng.choice(SENTENCES) for _ in range(count))))
    return out


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def checks(n: int) -> dict[str, object]:
    moderator = Moderator()
    rng = random.Random(3)
    moderator.check(BUILTIN, "input", ["warm up"])
    by_bucket: dict[str, list[float]] = {}
    for bucket, text in tqdm(prompts(rng, n), desc="prompt checks", mininterval=5):
        by_bucket.setdefault(bucket, []).append(timed(lambda t=text: moderator.check(BUILTIN, "input", [t])))
    every = [v for values in by_bucket.values() for v in values]
    dated = [timed(lambda t=rng.choice(DATED): moderator.check(BUILTIN, "input", [t])) for _ in range(n // 3)]
    answer = ANSWER * 6
    windows = []
    for _ in tqdm(range(n), desc="output windows", mininterval=5):
        end = rng.randrange(CONTEXT_CHARS + 200, len(answer))
        window = answer[end - CONTEXT_CHARS - 130 : end]  # ~32 new tokens (~130 characters) and the context
        windows.append(timed(lambda w=window: moderator.check(BUILTIN, "output", [w], WINDOWS_PER_CHECK)))
    return {
        "prompt_check_ms": summary(every),
        "prompt_check_ms_by_length": {b: summary(v) for b, v in sorted(by_bucket.items())},
        "short_turn_with_a_date_check_ms": summary(dated),
        "output_window_check_ms": summary(windows),
    }


def stream(client: httpx.Client, chat_id: str, content: str, max_tokens: int) -> tuple[float, float, str] | None:
    """(TTFT ms, median gap between token events ms, run id) of one chat turn; None when it was refused."""
    run = ChatClient(client).send(chat_id, content, max_tokens=max_tokens)
    if run.ttft_s is None:
        last = run.names[-1] if run.events else ""
        if last == "moderation":
            return None
        raise RuntimeError(f"no token (last event {last})")
    stamps = run.token_times
    gaps = [(b - a) * 1000 for a, b in zip(stamps, stamps[1:], strict=False)]
    return run.ttft_s * 1000, statistics.median(gaps) if gaps else 0.0, run.run_id or ""


def moderated_by_mode(stack: Stack, results: dict[str, list[tuple[float, float, str]]]) -> dict[str, list[Event]]:
    """Each mode's PromptModerated events (the stage's check time, the policy it applied), read in one pass."""
    from registry.client import connect
    from safety.replay import events
    from topics.pipeline import PROMPT_MODERATED

    connect(stack.registry_url)  # records carry their writer's schema id, resolved through the stack's registry
    mode_of = {run_id: mode for mode, runs in results.items() for _, _, run_id in runs}
    out: dict[str, list[Event]] = {mode: [] for mode in results}
    for record in events(ApiSettings().kafka_bootstrap, PROMPT_MODERATED, stack.namespace):
        mode = mode_of.get(record["prompt"]["run_id"])
        if mode is not None:
            out[mode].append(record)
    return out


def hop_ms(moderated: Event) -> float:
    # Avro's timestamp-millis decodes to datetimes
    return float(moderated["moderated_at"] - moderated["prompt"]["created_at"])  # epoch ms, as every timestamp


def on_stack(pairs: int, max_tokens: int, port_base: int, think_ms: int) -> dict[str, object]:
    stack = Stack(namespace=f"bench{uuid.uuid4().hex[:6]}", port_base=port_base)
    stack.up()
    try:
        user = credential("bench-safety", "enterprise", 30 * 86_400)
        root = credential("root", "pro", 30 * 86_400, admin=True)
        api = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {user}"}, timeout=120)
        admin = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {root}"}, timeout=30)
        off = {"version": "bench-off", "rules": []}
        on = {"version": "bench-on", "rules": [r.model_dump() for r in BUILTIN.rules]}

        def run(mode: str, content: str) -> tuple[float, float, str] | None:
            response = admin.put("/v1/admin/safety/policies/enterprise", json=on if mode == "with" else off)
            response.raise_for_status()
            chat = api.post("/v1/chats").json()["id"]
            time.sleep(think_ms / 1000)
            return stream(api, chat, content, max_tokens)

        rng = random.Random(5)
        for i in range(3):
            run("with", f"Warm up {i}.")
            run("without", f"Warm up {i}.")
        results: dict[str, list[tuple[float, float, str]]] = {"with": [], "without": []}
        diffs_ttft, diffs_gap = [], []
        refused = 0
        for i in tqdm(range(pairs), desc="pairs", mininterval=5):
            content = f"{rng.choice(SENTENCES)} ({i})"
            order = ["with", "without"] if rng.random() < 0.5 else ["without", "with"]
            maybe = {mode: run(mode, content) for mode in order}
            got = {mode: value for mode, value in maybe.items() if value is not None}
            if len(got) < 2:  # refused under the built-in policy: a false positive, counted, no pair
                refused += 1
                continue
            for mode, value in got.items():
                results[mode].append(value)
            diffs_ttft.append(got["with"][0] - got["without"][0])
            diffs_gap.append(got["with"][1] - got["without"][1])
        admin.delete("/v1/admin/safety/policies/enterprise")
        moderated = moderated_by_mode(stack, results)
    finally:
        stack.stop()
        stack.forget()  # its topics and keyspace
    ttft = {m: [r[0] for r in v] for m, v in results.items()}
    gap = {m: [r[1] for r in v] for m, v in results.items()}
    checked = moderated["with"]
    hop = {m: [hop_ms(r) for r in v] for m, v in moderated.items()}
    return {
        "pairs": len(diffs_ttft),
        "pairs_refused_with_moderation": refused,
        "max_tokens": max_tokens,
        "think_ms": think_ms,
        "ttft_ms_with_moderation": summary(ttft["with"]),
        "ttft_ms_without_moderation": summary(ttft["without"]),
        "added_ttft_ms_median_of_pair_differences": round(statistics.median(diffs_ttft), 2),
        "ttft_ratio_p50": round(pct(ttft["with"], 50) / pct(ttft["without"], 50), 3),
        "inter_token_gap_ms_with_moderation": summary(gap["with"]),
        "inter_token_gap_ms_without_moderation": summary(gap["without"]),
        "added_inter_token_gap_ms_median_of_pair_differences": round(statistics.median(diffs_gap), 2),
        "stage_check_ms_from_events": summary([r["check_ms"] for r in checked]) if checked else None,
        # From the edge's acceptance of a prompt to the moderation stage's verdict (both clocks on this
        # machine): the stage's own share of TTFT, without the engine's and the other hops' noise.
        "moderation_hop_ms_with": summary(hop["with"]),
        "moderation_hop_ms_without": summary(hop["without"]),
        "added_at_moderation_hop_ms_p50": round(pct(hop["with"], 50) - pct(hop["without"], 50), 2),
        # "with" runs the stage moderated under another policy (the PUT had not reached it yet): should be 0
        "with_runs_under_another_policy": sum(r["policy_version"] != "bench-on" for r in checked),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checks", type=int, default=300)
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--port-base", type=int, default=28400)
    parser.add_argument("--think-ms", type=int, default=500)
    parser.add_argument("--checks-only", action="store_true", help="the checks in this process, no stack")
    args = parser.parse_args()
    measured = checks(args.checks)
    if args.checks_only:
        print(json.dumps(measured, indent=2))
        return
    result = {
        "benchmark": "safety_latency",
        **measured,
        **on_stack(args.pairs, args.max_tokens, args.port_base, args.think_ms),
    }
    out = Path(__file__).parent / "results" / "safety_latency.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
