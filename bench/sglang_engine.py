"""The SGLang engine path, checked against a running SGLang server (needs a GPU; see docs/gpu.md).

Drives Parley's own engine client (inference/engine.py, the code the inference consumer runs) against
SGLang's OpenAI-compatible server and prints JSON:
- a streamed answer parses to text, finish reason and running usage;
- a second turn of the same conversation reports cached prompt tokens (RadixAttention; the server must run
  with --enable-cache-report);
- a continued answer (`continue_final_message`, what a takeover sends) streams only the continuation;
- closing a stream mid-answer (a cancel) leaves the server serving the next request;
- aggregate tokens/s and TTFT with 1, 4, 8, 16 concurrent sequences.

Usage: python bench/sglang_engine.py --url http://127.0.0.1:30000 [--model smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from inference.engine import OpenAIStreamEngine, Request, generate


async def once(engine: OpenAIStreamEngine, request: Request) -> dict:
    started = time.perf_counter()
    text, last = "", None
    async for piece, progress in generate(engine, request):
        text += piece
        last = progress
    assert last is not None
    outcome = last
    ttft = (outcome.first_token_at - started) if outcome.first_token_at else None
    return {
        "text": text,
        "finish_reason": outcome.finish_reason,
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "cached_tokens": outcome.cached_tokens,
        "ttft_ms": ttft and round(ttft * 1000, 1),
        "seconds": time.perf_counter() - started,
    }


async def main(url: str, model: str) -> dict:
    engine = OpenAIStreamEngine("sglang", url)
    result: dict = {"healthy": await engine.healthy()}
    history = [
        {"role": "system", "content": "You are a helpful assistant. " * 20},
        {"role": "user", "content": "Tell me about lighthouses."},
    ]
    first = await once(engine, Request("r1", model, history, 64, 0.0))
    history += [{"role": "assistant", "content": first["text"]}, {"role": "user", "content": "And their keepers?"}]
    second = await once(engine, Request("r2", model, history, 32, 0.0))
    result["stream"] = {k: first[k] for k in ("finish_reason", "prompt_tokens", "completion_tokens", "ttft_ms")}
    result["second_turn_cached_fraction"] = round(second["cached_tokens"] / max(1, second["prompt_tokens"]), 3)
    cont = await once(engine, Request("r3", model, history[:2], 32, 0.0, continuation=first["text"][:40]))
    result["continuation_repeats_prefix"] = cont["text"].startswith(first["text"][:40])
    cancel = asyncio.Event()
    request = Request("r4", model, history[:2], 256, 0.7)
    pieces = 0
    async for _piece, _outcome in generate(engine, request, cancel):
        pieces += 1
        if pieces == 5:
            cancel.set()
    result["serves_after_cancel"] = bool((await once(engine, Request("r5", model, history[:2], 8)))["text"])
    levels = {}
    for n in (1, 4, 8, 16):
        started = time.perf_counter()
        runs = await asyncio.gather(
            *(
                once(
                    engine,
                    Request(
                        f"c{n}-{i}",
                        model,
                        [{"role": "user", "content": f"Write a long story about place number {i}."}],
                        256,
                        0.7,
                    ),
                )
                for i in range(n)
            )
        )
        elapsed = time.perf_counter() - started
        ttfts = sorted(r["ttft_ms"] for r in runs if r["ttft_ms"] is not None)
        levels[str(n)] = {
            "tokens_per_s": round(sum(r["completion_tokens"] for r in runs) / elapsed, 1),
            "ttft_ms_p50": ttfts[len(ttfts) // 2],
            "ttft_ms_max": ttfts[-1],
        }
    for row in levels.values():
        row["ratio_to_1"] = round(row["tokens_per_s"] / levels["1"]["tokens_per_s"], 2)
    result["concurrency"] = levels
    await engine.aclose()
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.url, args.model)), indent=2))
