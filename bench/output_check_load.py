"""The output check at GPU token rates: does an inference consumer's check keep up with 64 streams at once?

An SGLang engine streams tens of tokens a second to each of 64 sequences; the consumer checks each answer
every 32 tokens (safety/output.py). Here 64 answers the served model wrote (safety/data/smollm_answers.jsonl)
are streamed at --rate tokens a second each through one consumer's OutputGuard and Moderator, as the consumer
does, on this machine's CPUs; beside them, the same with one stream (the baseline, same run). Reported per
configuration: the checks made, the time from a window falling due to its check's verdict (p50, p95, max),
how much of each answer was checked before its last token (the rest waits for the final check, which holds
the end of the stream), and the final check's wait. The check falls behind when that wait grows with the
streams. Prints JSON and writes bench/results/output_check_load.json.

Compared in the same run: every check in the order asked (fifo, as before), and the last window of each
answer, which holds the end of its stream, before the windows checked while answers stream on (safety/
moderator.py Turns); with one check at a time and with two (Moderator workers).

Usage: python bench/output_check_load.py [--streams 64] [--rate 40] [--workers 1 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from measure import pct

from conversation import tokens
from runtime.settings import DEFAULT_POOLS
from safety.moderator import Moderator
from safety.output import OutputGuard
from safety.policy import BUILTIN

ROOT = Path(__file__).resolve().parent.parent


def answers(count: int) -> list[list[str]]:
    """`count` answers, each as the pieces (tokens) an engine streams."""
    counter = tokens.load(DEFAULT_POOLS["small"].tokenizer).tokenizer
    lines = (ROOT / "safety/data/smollm_answers.jsonl").read_text().splitlines()
    texts = [json.loads(line)["answer"] for line in lines]
    texts.sort(key=len, reverse=True)  # the longest answers: the most windows
    out = []
    for text in texts[:count]:
        encoding = counter.encode(text, add_special_tokens=False)
        out.append([text[a:b] for a, b in encoding.offsets])
    return out


async def stream(moderator: Moderator, pieces: list[str], rate: float, fifo: bool) -> dict[str, float]:
    guard = OutputGuard(moderator, BUILTIN, lambda: None)
    due: list[float] = []
    waits: list[float] = []
    original = guard._check

    async def timed(end: int, urgent: bool) -> None:
        asked = time.perf_counter()
        await original(end, urgent=urgent or fifo)  # fifo: every check in the order asked, as before
        waits.append(time.perf_counter() - asked)

    guard._check = timed  # type: ignore[method-assign]
    started = time.perf_counter()
    for i, piece in enumerate(pieces, 1):
        await asyncio.sleep(max(0.0, started + i / rate - time.perf_counter()))
        before = guard._pending
        guard.feed(piece, i)
        if guard._pending is not before:
            due.append(time.perf_counter())
    await guard.idle()
    checked_before_end = guard.checked / max(1, len(guard.text))
    last = time.perf_counter()
    await guard.finish()
    return {
        "checks": len(guard.windows),
        "waits": waits,
        "checked_before_end": checked_before_end,
        "final_wait_s": time.perf_counter() - last,
        "tokens": len(pieces),
        "seconds": last - started,
    }


async def run(moderator: Moderator, texts: list[list[str]], rate: float, fifo: bool) -> dict[str, object]:
    results = await asyncio.gather(*(stream(moderator, pieces, rate, fifo) for pieces in texts))
    waits = [w for r in results for w in r["waits"]]
    finals = [r["final_wait_s"] for r in results]
    tokens_out = sum(r["tokens"] for r in results)
    return {
        "streams": len(texts),
        "tokens_per_s_streamed": round(tokens_out / max(r["seconds"] for r in results), 1),
        "checks": sum(r["checks"] for r in results),
        "check_wait_ms": {
            "p50": round(pct(waits, 50) * 1000, 1),
            "p95": round(pct(waits, 95) * 1000, 1),
            "max": round(max(waits) * 1000, 1),
        },
        "checked_before_last_token_median": round(statistics.median(r["checked_before_end"] for r in results), 3),
        "final_check_wait_ms_median": round(statistics.median(finals) * 1000, 1),
        "final_check_wait_ms_max": round(max(finals) * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--rate", type=float, default=40.0, help="tokens a second per stream")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="checks run at once")
    parser.add_argument("--tokens", type=int, default=240, help="tokens streamed per answer")
    args = parser.parse_args()
    texts = [pieces[: args.tokens] for pieces in answers(args.streams)]
    report: dict[str, object] = {"rate_per_stream": args.rate, "tokens_per_answer": args.tokens}
    for workers in args.workers:
        moderator = Moderator(threads=1, workers=workers)
        moderator.check(BUILTIN, "output", ["warm up " * 40], 4)
        report[f"workers_{workers}"] = {
            "baseline_1_stream": asyncio.run(run(moderator, texts[:1], args.rate, fifo=False)),
            f"{args.streams}_streams_fifo": asyncio.run(run(moderator, texts, args.rate, fifo=True)),
            f"{args.streams}_streams_last_window_first": asyncio.run(run(moderator, texts, args.rate, fifo=False)),
        }
    print(json.dumps(report, indent=2))
    out = ROOT / "bench/results/output_check_load.json"
    out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
