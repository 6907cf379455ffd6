"""Parley's engine client against a llama-server (a CUDA build on a GPU machine: bench/gpu_check.sh; or the
local CPU build), as the inference consumer drives it. Prints JSON:

- stream: one answer's text, finish reason, usage and TTFT;
- continuation: a run taken over continues after the text it was given (`continue_final_message`);
- cancel: with every slot busy with a long answer, one is cancelled mid-stream and a new request gets its slot
  (its TTFT, against the long answers still running);
- concurrent: N streams at once (64 by default) through the coalescer the consumer uses: aggregate tokens/s,
  TTFT and the gaps between coalesced records (p50/p99), and errors.

It imports only inference.engine and inference.coalesce (httpx and the standard library), so a GPU machine
needs just the wheels bench/gpu_check.sh carries.

Usage: python bench/gpu_engine.py --url http://127.0.0.1:8080 --slots 64 [--streams 64] [--tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from inference.coalesce import Coalescer
from inference.engine import OpenAIStreamEngine, Request, generate

MODEL = "gpu-check"
ASK = [{"role": "user", "content": "Write a long story about a lighthouse keeper and the sea."}]


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


async def answer(
    engine: OpenAIStreamEngine,
    request: Request,
    cancel: asyncio.Event | None = None,
    stop_after: int | None = None,
) -> dict:
    """One run as the consumer streams it: text coalesced into records, the gaps between records."""
    started = time.perf_counter()
    coalescer, records, gaps, last = Coalescer(0.02), 0, [], None
    text, outcome = "", None
    async for piece, progress in generate(engine, request, cancel):
        text += piece
        outcome = progress
        if coalescer.add(piece):
            now = time.perf_counter()
            if last is not None:
                gaps.append((now - last) * 1000)
            last, records = now, records + 1
        if cancel is not None and stop_after is not None and progress.pieces >= stop_after:
            cancel.set()
    assert outcome is not None
    first = outcome.first_token_at
    return {
        "text": text,
        "finish_reason": outcome.finish_reason,
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "ttft_ms": round((first - started) * 1000, 1) if first else None,
        "seconds": round(time.perf_counter() - started, 3),
        "records": records,
        "gaps_ms": gaps,
    }


def ask(run: str, tokens: int, **extra) -> Request:
    return Request(run, MODEL, ASK, tokens, 0.0, **extra)


async def check(url: str, slots: int, streams: int, tokens: int) -> dict:
    engine = OpenAIStreamEngine("llamacpp", url, slots=max(slots, streams))
    result: dict = {"healthy": await engine.healthy(), "slots": slots}
    first = await answer(engine, ask("stream", 48))
    result["stream"] = {k: v for k, v in first.items() if k not in ("text", "gaps_ms")}
    result["stream"]["text_chars"] = len(first["text"])

    given = first["text"][: len(first["text"]) // 2]
    cont = await answer(engine, ask("continue", 24, continuation=given))
    result["continuation"] = {
        "given_chars": len(given),
        "continued_chars": len(cont["text"]),
        "repeats_what_it_was_given": bool(given) and cont["text"].startswith(given),
    }

    # Every slot busy with a long answer; one is cancelled after a few tokens; a newcomer takes its slot.
    long = [asyncio.create_task(answer(engine, ask(f"long-{i}", 2048))) for i in range(slots - 1)]
    stop = asyncio.Event()
    cancelled = await answer(engine, ask("cancelled", 2048), stop, stop_after=4)
    newcomer = await answer(engine, ask("newcomer", 8))
    still_running = sum(not t.done() for t in long)
    for task in long:
        task.cancel()
    await asyncio.gather(*long, return_exceptions=True)
    result["cancel"] = {
        "cancelled_finish_reason": cancelled["finish_reason"],
        "cancelled_after_tokens": cancelled["completion_tokens"],
        "newcomer_ttft_ms": newcomer["ttft_ms"],
        "long_answers_still_running": still_running,
        "slot_freed": newcomer["completion_tokens"] > 0 and still_running == slots - 1,
    }

    started = time.perf_counter()
    runs = await asyncio.gather(
        *(answer(engine, ask(f"many-{i}", tokens)) for i in range(streams)), return_exceptions=True
    )
    seconds = time.perf_counter() - started
    done = [r for r in runs if isinstance(r, dict)]
    ttfts = [r["ttft_ms"] for r in done if r["ttft_ms"] is not None]
    gaps = [g for r in done for g in r["gaps_ms"]]
    result["concurrent"] = {
        "streams": streams,
        "errors": [f"{type(r).__name__}: {r}"[:200] for r in runs if not isinstance(r, dict)],
        "completion_tokens": sum(r["completion_tokens"] for r in done),
        "tokens_per_s": round(sum(r["completion_tokens"] for r in done) / seconds, 1),
        "ttft_ms_p50": pct(ttfts, 0.5),
        "ttft_ms_p99": pct(ttfts, 0.99),
        "record_gap_ms_p50": pct(gaps, 0.5),
        "record_gap_ms_p99": pct(gaps, 0.99),
        "records_per_stream_mean": round(statistics.fmean(r["records"] for r in done), 1) if done else None,
        "seconds": round(seconds, 2),
    }
    await engine.aclose()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--slots", type=int, required=True, help="the server's -np")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128, help="tokens per concurrent stream")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(check(args.url, args.slots, args.streams, args.tokens)), indent=2))


if __name__ == "__main__":
    main()
