"""A call to an MCP server's tool as the inference consumer makes it (runtime/mcp.py: a session of its own per
call, the official SDK over Streamable HTTP) against the same call on one session kept open (the floor), and a
tool answering 64 KiB against one answering a few bytes; interleaved round by round, random order within a
round, against the test server (tests/tools/mcp_server.py) on this machine.

Prints JSON, writes bench/results/mcp_tools.json.
Usage: python bench/mcp_tools.py [--rounds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mcp import Client  # noqa: E402
from measure import summary  # noqa: E402

from runtime import mcp  # noqa: E402
from tests.tools.mcp_server import start  # noqa: E402

ARGS = json.dumps({"city": "Oslo"})


async def main(rounds: int) -> dict[str, Any]:
    proc, url = start()
    row = {"name": "bench", "url": url, "auth_env": None, "timeout_s": 10.0, "max_result_bytes": 1 << 20}
    times: dict[str, list[float]] = {"session_per_call": [], "kept_session": [], "result_64kib": []}
    try:
        async with Client(url, cache=None) as kept:
            await kept.call_tool("weather", {"city": "Oslo"})  # warm both paths once
            await mcp.call(row, "weather", ARGS)

            async def per_call() -> None:
                assert (await mcp.call(row, "weather", ARGS)).status == "ok"

            async def on_kept() -> None:
                await kept.call_tool("weather", {"city": "Oslo"})

            async def large() -> None:
                assert (await mcp.call(row, "echo", json.dumps({"size": 65_536}))).status == "ok"

            work = {"session_per_call": per_call, "kept_session": on_kept, "result_64kib": large}
            for _ in tqdm(range(rounds), desc="rounds", file=sys.stderr):
                for name in random.sample(list(work), len(work)):
                    started = time.perf_counter()
                    await work[name]()
                    times[name].append((time.perf_counter() - started) * 1000)
    finally:
        proc.kill()
        proc.wait()
    out: dict[str, Any] = {name: summary(values) for name, values in times.items()}
    floor = out["kept_session"]["p50"]
    out["session_per_call_over_kept_p50"] = round(out["session_per_call"]["p50"] / floor, 2)
    out["session_overhead_ms_p50"] = round(out["session_per_call"]["p50"] - floor, 2)
    out["result_64kib_over_small_p50"] = round(out["result_64kib"]["p50"] / out["session_per_call"]["p50"], 2)
    out["rounds"] = rounds
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=40)
    result = asyncio.run(main(parser.parse_args().rounds))
    text = json.dumps(result, indent=2)
    print(text)
    (ROOT / "bench" / "results" / "mcp_tools.json").write_text(text + "\n")
