"""How many concurrent SSE streams one edge process holds, the delay it adds per token, and fan-out cost.

Streams: for N in (1, 100, 1000, 5000) concurrent streams, two servers are measured in the same run, each
its own uvicorn process on one core's worth of this machine:
  - edge:     the production stream path (ReplyHub reading its reply partition from Kafka -> api.streams.live
              -> api.streams.sse_stream -> sse-starlette), fed by a producer that writes each stream's
              records to Kafka with the wall-clock send time in the record;
  - baseline: a bare sse-starlette endpoint that yields the same schedule from asyncio timers.
The client opens N streams, then every stream gets --records records --interval-ms apart; the delay of a
record is client receive time - its send time. Edge-added delay = edge p50/p99 - baseline p50/p99.

Fan-out: with 1 and with 3 edge replicas (each reading only its own reply partition), S streams spread
over the replicas; records read from Kafka by all replicas (their parley_edge_reply_records_read_total)
per record delivered to a client. O(tokens) fan-out means 1.0 whatever the replica count.

Needs Kafka only (started if not running). Prints JSON and writes bench/results/edge_streams.json.
Usage: python bench/edge_streams.py [--streams 1,100,1000,5000] [--records 20] [--interval-ms 250]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import httpx
from measure import pct

from replay.sse import aiter_sse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BOOTSTRAP = os.environ.get("PARLEY_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
PORT = 18900


# -- the two servers (run as `python bench/edge_streams.py --serve edge|baseline ...`) ----------------------
def serve(kind: str, port: int, namespace: str, partition: int, records: int, interval_s: float) -> None:
    import uvicorn
    from fastapi import FastAPI, Response
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from sse_starlette.sse import EventSourceResponse

    starters: list[Any] = []

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> Any:
        for begin in starters:
            await begin()
        yield

    app = FastAPI(lifespan=lifespan)
    go = asyncio.Event()
    schedule: dict[str, float] = {}

    @app.post("/go")
    async def start() -> dict[str, bool]:
        schedule["t0"] = time.time()
        go.set()
        return {"ok": True}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    if kind == "baseline":

        async def timed() -> Any:
            # Every stream shares one schedule (like the feeder's rounds), and a record's send time is its
            # scheduled time, so time spent queueing behind the other streams counts as delay, as for the edge.
            await go.wait()
            for seq in range(records):
                due = schedule["t0"] + seq * interval_s
                await asyncio.sleep(max(0.0, due - time.time()))
                yield {"event": "token", "data": json.dumps({"delta": f"{due:.6f}", "seq": seq})}
            yield {"event": "run.completed", "data": "{}"}

        @app.get("/stream/{run_id}")
        async def baseline_stream(run_id: str) -> EventSourceResponse:
            return EventSourceResponse(timed(), ping=15)

    else:
        from api import streams
        from api.replies import ReplyHub
        from api.settings import ApiSettings
        from api.streams import sse_stream

        settings = ApiSettings(namespace=namespace, kafka_bootstrap=BOOTSTRAP)
        hub = ReplyHub(BOOTSTRAP, namespace, group=f"{namespace}.bench-edges")  # the bench's replicas' group
        deps = SimpleNamespace(settings=settings, replies=hub)

        async def begin() -> None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, hub.start, loop)

        starters.append(begin)

        @app.get("/partitions")
        async def partitions() -> list[int]:
            return list(hub.partitions)

        @app.get("/stream/{run_id}")
        async def edge_stream(run_id: str, partition: int) -> EventSourceResponse:
            live = hub.open(run_id, partition)
            replies = streams.live(deps, run_id, partition, live)  # type: ignore[arg-type]
            return EventSourceResponse(sse_stream(deps, run_id, replies, live=True), ping=15)  # type: ignore[arg-type]

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", backlog=8192)


# -- the harness ---------------------------------------------------------------------------------------------
def start_server(kind: str, port: int, namespace: str, partition: int, args: argparse.Namespace) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve",
            kind,
            "--port",
            str(port),
            "--namespace",
            namespace,
            "--partition",
            str(partition),
            "--records",
            str(args.records),
            "--interval-ms",
            str(args.interval_ms),
        ],
        cwd=ROOT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{kind} server did not start")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def feed(namespace: str, runs: list[tuple[str, int]], records: int, interval_s: float) -> None:
    """Write each run's records (started is implied; deltas carrying their send time, then completed)."""
    from confluent_kafka import Producer

    from topics import codec
    from topics.pipeline import TOKEN_DELTA, named

    producer = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 1, "queue.buffering.max.messages": 1_000_000})
    topic = named(TOKEN_DELTA, namespace)

    def record(run_id: str, seq: int, kind: str, text: str = "") -> bytes:
        return codec.encode(
            TOKEN_DELTA.schema,
            {
                "run_id": run_id,
                "chat_id": run_id,
                "seq": seq,
                "kind": kind,
                "text": text,
                "model": "bench",
                "finish_reason": "stop" if kind == "completed" else None,
                "usage": None,
                "error_code": None,
                "error_message": None,
                "emitted_at": int(time.time() * 1000),
            },
        )

    next_at = time.perf_counter()
    for seq in range(1, records + 1):
        for run_id, partition in runs:
            producer.produce(topic, record(run_id, seq, "delta", f"{time.time():.6f}"), partition=partition)
            producer.poll(0)
        producer.flush(30)
        next_at += interval_s
        time.sleep(max(0.0, next_at - time.perf_counter()))
    for run_id, partition in runs:
        producer.produce(topic, record(run_id, records + 1, "completed"), partition=partition)
    producer.flush(30)


async def clients(urls: list[str], go: Any) -> tuple[list[float], int, int]:
    """Open every stream, wait until all are open, start the records, collect each record's delay."""
    delays: list[float] = []
    opened = asyncio.Event()
    state = {"open": 0, "failed": 0, "delivered": 0}
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=60, sock_read=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(url: str) -> None:
            try:
                async with session.get(url) as response:
                    state["open"] += 1
                    if state["open"] + state["failed"] == len(urls):
                        opened.set()
                    async for sse in aiter_sse(raw.decode() async for raw in response.content):
                        if sse.get("event") == "run.completed":
                            state["delivered"] += 1
                            return
                        if isinstance(sse.get("data"), dict) and "delta" in sse["data"]:
                            delays.append((time.time() - float(sse["data"]["delta"])) * 1000)
                            state["delivered"] += 1
            except (TimeoutError, aiohttp.ClientError):
                state["failed"] += 1
                if state["open"] + state["failed"] == len(urls):
                    opened.set()

        tasks = [asyncio.create_task(one(u)) for u in urls]
        await asyncio.wait_for(opened.wait(), 300)
        await asyncio.sleep(0.5)  # let the last streams' generators reach their first await
        await asyncio.get_running_loop().run_in_executor(None, go)
        await asyncio.gather(*tasks)
    return delays, state["open"], state["delivered"]


def partitions_held(ports: list[int], total: int) -> list[list[int]]:
    """The reply partitions each edge replica holds, once their group has split all `total` among them."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        owned = [httpx.get(f"http://127.0.0.1:{port}/partitions").json() for port in ports]
        if sorted(p for mine in owned for p in mine) == list(range(total)):
            return owned
        time.sleep(0.2)
    raise RuntimeError(f"the edge replicas did not split the reply partitions: {owned}")


def measure(kind: str, n: int, args: argparse.Namespace, namespace: str) -> dict[str, Any]:
    proc = start_server(kind, PORT, namespace, 0, args)
    try:
        partition = partitions_held([PORT], args.reply_partitions)[0][0] if kind == "edge" else 0
        runs = [(str(uuid.uuid1()), partition) for _ in range(n)]
        urls = [f"http://127.0.0.1:{PORT}/stream/{run_id}?partition={p}" for run_id, p in runs]
        if kind == "edge":
            go = lambda: feed(namespace, runs, args.records, args.interval_ms / 1000)  # noqa: E731
        else:
            go = lambda: httpx.post(f"http://127.0.0.1:{PORT}/go")  # noqa: E731
        rss_before = rss_mb(proc.pid)
        started = time.perf_counter()
        delays, held, delivered = asyncio.run(clients(urls, go))
        delivered -= held  # count the deltas only (each held stream also delivered its completion)
        return {
            "server": kind,
            "streams": n,
            "held": held,
            "records_delivered": delivered,
            "records_expected": n * args.records,
            "delay_ms_p50": pct(delays, 50, 2),
            "delay_ms_p99": pct(delays, 99, 2),
            "server_rss_mb_idle": round(rss_before, 1),
            "seconds": round(time.perf_counter() - started, 1),
        }
    finally:
        proc.terminate()
        proc.wait(10)


def fan_out(replicas: int, streams_total: int, args: argparse.Namespace, namespace: str) -> dict[str, Any]:
    procs = [start_server("edge", PORT + r, namespace, r, args) for r in range(replicas)]
    try:
        owned = partitions_held([PORT + r for r in range(replicas)], args.reply_partitions)
        replica_of = [i % replicas for i in range(streams_total)]  # stream i on replica i % n, one of its partitions
        runs = [(str(uuid.uuid1()), owned[r][i // replicas % len(owned[r])]) for i, r in enumerate(replica_of)]
        urls = [
            f"http://127.0.0.1:{PORT + r}/stream/{run}?partition={p}"
            for (run, p), r in zip(runs, replica_of, strict=True)
        ]
        before = sum(read_counter(PORT + r) for r in range(replicas))
        go = lambda: feed(namespace, runs, args.records, args.interval_ms / 1000)  # noqa: E731
        _, _, delivered = asyncio.run(clients(urls, go))
        read = sum(read_counter(PORT + r) for r in range(replicas)) - before
        return {
            "replicas": replicas,
            "streams": streams_total,
            "records_read_by_all_replicas": read,
            "records_delivered": delivered,
            "read_per_delivered": round(read / delivered, 3) if delivered else None,
        }
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


def read_counter(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    found = re.search(r"^parley_edge_reply_records_read_total (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="1,100,1000,5000")
    parser.add_argument("--records", type=int, default=20)
    parser.add_argument("--interval-ms", type=float, default=250)
    parser.add_argument("--fan-out-streams", type=int, default=300)
    parser.add_argument("--serve", choices=("edge", "baseline"))
    parser.add_argument("--port", type=int, default=PORT)
    parser.add_argument("--namespace", default="")
    parser.add_argument("--partition", type=int, default=0)
    args = parser.parse_args()
    from registry.store import InProcess
    from topics import codec

    # The registry's rules in this process: ids follow the schemas' content, so the feeder and the servers agree
    # without a registry service (this bench measures the edge).
    codec.use(codec.Schemas(InProcess())).register_all()
    if args.serve:
        serve(args.serve, args.port, args.namespace, args.partition, args.records, args.interval_ms / 1000)
        return

    from tqdm import tqdm

    from infra.stack import Stack
    from runtime.kafka import ensure_topics

    subprocess.run(["bash", str(ROOT / "infra/local/kafka.sh"), "start"], check=True)
    namespace = f"bench{uuid.uuid4().hex[:8]}"
    settings = Stack(namespace=namespace).settings
    ensure_topics(BOOTSTRAP, namespace, settings.layout)
    args.reply_partitions = settings.reply_partitions
    sizes = [int(s) for s in args.streams.split(",")]
    rows = []
    with tqdm(total=2 * len(sizes) + 2, desc="edge streams", file=sys.stderr) as bar:
        for n in sizes:
            pair = {}
            for kind in ("baseline", "edge"):
                pair[kind] = measure(kind, n, args, namespace)
                bar.update()
            rows.append(
                {
                    "streams": n,
                    "edge": pair["edge"],
                    "baseline": pair["baseline"],
                    "edge_added_ms_p50": round(pair["edge"]["delay_ms_p50"] - pair["baseline"]["delay_ms_p50"], 2),
                    "edge_added_ms_p99": round(pair["edge"]["delay_ms_p99"] - pair["baseline"]["delay_ms_p99"], 2),
                }
            )
        fan = []
        for replicas in (1, 3):
            fan.append(fan_out(replicas, args.fan_out_streams, args, namespace))
            bar.update()
    result = {
        "benchmark": "edge_streams",
        "records_per_stream": args.records,
        "interval_ms": args.interval_ms,
        "cpus": os.cpu_count(),
        "streams": rows,
        "fan_out": fan,
        "note": "delays are send (producer or timer) -> client receive on one 2-core machine shared by the "
        "server, the client and Kafka; compare edge with baseline of the same row, not across rows.",
    }
    print(json.dumps(result, indent=2))
    out = ROOT / "bench" / "results" / "edge_streams.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
