"""Today's OpenAI API on the real local stack (one edge, the embedded engine), each figure beside its baseline in
the same run, interleaved round by round (random order within a round) so the machine's noise falls on all:

- a tool round trip: `POST /v1/chat/completions` with a named function (the answer is the call, decoded under
  the tools' schema) through the whole pipeline, against the same body sent straight to the engine (llama-server
  with the schema the inference consumer makes, inference/calls.py); the added time is the pipeline's;
- time to the first text: the Responses API streamed (`response.output_text.delta`) against chat completions
  streamed, the same input and max tokens;
- embeddings: `POST /v1/embeddings` of 1 and of 32 texts (the metering stage's encoder, metered) against the
  edge's plain `GET /v1/models` as the floor.

Prints JSON, writes bench/results/openai_api.json.
Usage: python bench/openai_api.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import json
import random
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
from inference.calls import engine_options  # noqa: E402
from infra.stack import Stack  # noqa: E402

PORT_BASE = 19800
MODEL = "smollm2-135m-instruct"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def tool_via_pipeline(api: httpx.Client) -> None:
    body = {
        "model": MODEL,
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": NAMED,
        "max_tokens": 48,
        "temperature": 0,
    }
    answer = api.post("/v1/chat/completions", json=body).json()
    assert answer["choices"][0]["finish_reason"] == "tool_calls", answer


def tool_direct(engine: httpx.Client, url: str) -> None:
    generation = {"tools": json.dumps([WEATHER]), "tool_choice": "function:get_weather", "parallel_tool_calls": True}
    options, _ = engine_options(generation)  # type: ignore[arg-type]
    body = {**options, "model": MODEL, "messages": ASK, "max_tokens": 48, "temperature": 0, "stream": True}
    with engine.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        for _ in response.iter_lines():  # read to the end, as the inference consumer does
            pass


def first_text(api: httpx.Client, path: str, body: dict[str, Any], is_text: Any) -> float:
    started = time.perf_counter()
    with api.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        first = None
        for line in response.iter_lines():
            if first is None and line.startswith("data:") and is_text(line[5:].strip()):
                first = (time.perf_counter() - started) * 1000
    assert first is not None
    return first


def responses_text(data: str) -> bool:
    return data.startswith("{") and json.loads(data)["type"] == "response.output_text.delta"


def chunk_text(data: str) -> bool:
    if not data.startswith("{"):
        return False
    choices = json.loads(data).get("choices") or [{}]
    return bool(choices[0].get("delta", {}).get("content"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    result: dict[str, Any] = {"bench": "openai_api", "date": time.strftime("%Y-%m-%d"), "rounds": args.rounds}
    stack = Stack(namespace=f"b{uuid.uuid4().hex[:8]}", port_base=PORT_BASE, replicas=1)
    stack.up()
    try:
        auth = {"Authorization": f"Bearer {credential(f'bench-{uuid.uuid4().hex[:6]}', 'enterprise')}"}
        with (
            httpx.Client(base_url=stack.api_url, headers=auth, timeout=120) as api,
            httpx.Client(timeout=120, headers=stack.engine_headers()) as engine,
        ):
            url = stack.engine_url()
            prompt = "Name three colours."
            ways = {
                "tool_call_pipeline": lambda: timed(lambda: tool_via_pipeline(api)),
                "tool_call_engine_direct": lambda: timed(lambda: tool_direct(engine, url)),
                "responses_stream_first_text": lambda: first_text(
                    api,
                    "/v1/responses",
                    {"model": MODEL, "input": prompt, "max_output_tokens": 16, "stream": True},
                    responses_text,
                ),
                "chat_completions_stream_first_text": lambda: first_text(
                    api,
                    "/v1/chat/completions",
                    {
                        "model": MODEL,
                        "messages": [{"role": "user", "content": prompt}],
                        "max_tokens": 16,
                        "stream": True,
                    },
                    chunk_text,
                ),
                "embeddings_1": lambda: timed(
                    lambda: api.post(
                        "/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": "a cat"}
                    ).raise_for_status()
                ),
                "embeddings_32": lambda: timed(
                    lambda: api.post(
                        "/v1/embeddings",
                        json={
                            "model": "all-minilm-l6-v2",
                            "input": [f"sentence number {i} about cats" for i in range(32)],
                        },
                    ).raise_for_status()
                ),
                "baseline_models": lambda: timed(lambda: api.get("/v1/models").raise_for_status()),
            }
            for way in ways.values():  # warm every path once
                way()
            times: dict[str, list[float]] = {name: [] for name in ways}
            rng = random.Random(7)
            for _ in tqdm(range(args.rounds), desc="rounds", file=sys.stderr):
                order = list(ways)
                rng.shuffle(order)
                for name in order:
                    times[name].append(ways[name]())
    finally:
        stack.stop()
    stats = {name: summary(values) for name, values in times.items()}
    result["ms"] = stats
    p50 = {name: s["p50"] for name, s in stats.items()}
    result["tool_round_trip_added_p50_ms"] = round(p50["tool_call_pipeline"] - p50["tool_call_engine_direct"], 1)
    result["tool_round_trip_ratio_p50"] = round(p50["tool_call_pipeline"] / p50["tool_call_engine_direct"], 2)
    result["responses_over_chat_completions_ttft_p50"] = round(
        p50["responses_stream_first_text"] / p50["chat_completions_stream_first_text"], 2
    )
    result["embeddings_over_baseline_p50"] = {
        name: round(p50[name] / p50["baseline_models"], 2) for name in ("embeddings_1", "embeddings_32")
    }
    text = json.dumps(result, indent=2)
    print(text)
    (ROOT / "bench" / "results" / "openai_api.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
