"""The replicated data plane against the single node, in one run, and failover on the local cluster.

1. For the single-node stack and then the 3-broker, 3-node cluster (same pipeline: two edges, two consumers
   per pool): start time and resident memory of every process, pipeline-added time to first token (the same
   prompt straight to the engine and through the pipeline, in random order, as bench/pipeline_ttft.py), and
   aggregate tokens/s with 8 chats answering at once.
2. On the cluster, while 3 chats stream: kill -9 the broker leading the reply partitions the edge reads, and
   time, for each stream mid-answer at the kill, its next token (then restart the broker and wait until every
   partition is in sync again); and kill -9 a Cassandra node and time until a chat turn sent just after the
   kill is stored.

Prints JSON and writes bench/results/cluster.json after every phase (`complete` is true once all ran).
Usage: python bench/cluster.py [--pairs 30] [--kills 10] [--node-kills 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from cassandra.cluster import Cluster as CqlCluster
from confluent_kafka.admin import AdminClient
from inference_pools import via_pipeline
from measure import summary
from pipeline_ttft import engine_ttft, pipeline_ttft
from procstat import stack_memory
from tqdm import tqdm

from api.auth import credential
from infra.stack import Stack
from infra.topology import CLUSTER, SINGLE_NODE, Topology
from processors.settings import ProcessorSettings
from replay.client import ChatClient
from topics.pipeline import TOKEN_DELTA, named

PORT_BASE = 19600  # below the ephemeral ports (32768+): a client socket once held the edge's 38100
STORY = "Write a long story about a lighthouse keeper and a storm at sea."


def added_ttft(stack: Stack, client: httpx.Client, pairs: int) -> dict[str, object]:
    engine, url = httpx.Client(timeout=120, headers=stack.engine_headers()), stack.engine_url()
    system = ProcessorSettings().system_prompt
    rng = random.Random(7)
    added, through, alone = [], [], []
    for i in tqdm(range(pairs), desc=f"ttft pairs ({stack.tag})", unit="pair", mininterval=5):
        content = f"Name a fruit. ({i})"
        messages = [{"role": "system", "content": system}, {"role": "user", "content": content}]
        chat = client.post("/v1/chats").json()["id"]
        engine_ttft(engine, url, messages, 16)  # both find the prompt in the engine's cache
        if rng.random() < 0.5:
            e = engine_ttft(engine, url, messages, 16)
            p = pipeline_ttft(client, chat, content, 16)
        else:
            p = pipeline_ttft(client, chat, content, 16)
            e = engine_ttft(engine, url, messages, 16)
        added.append(p - e)
        through.append(p)
        alone.append(e)
    return {"pipeline_added_ms": summary(added), "pipeline_ms": summary(through), "engine_ms": summary(alone)}


async def eight_at_once(api_url: str, token: str, rounds: int) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {token}"}
    per_round = []
    async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=300) as api:
        for r in range(rounds):
            started = time.perf_counter()
            runs = await asyncio.gather(*(via_pipeline(api, f"{STORY} ({r}.{i})", 96) for i in range(8)))
            per_round.append(sum(tokens for _, _, tokens in runs) / (time.perf_counter() - started))
    return {"tokens_per_s_median": round(statistics.median(per_round), 1), "rounds": [round(x, 1) for x in per_round]}


def measure(topology: Topology, args: argparse.Namespace) -> tuple[Stack, dict[str, Any]]:
    stack = Stack(
        namespace=f"bench{uuid.uuid4().hex[:6]}",
        port_base=PORT_BASE,
        replicas=2,
        workers={"small": 2, "large": 2},
        topology=topology,
    )
    started = time.perf_counter()
    try:
        stack.up()
        result: dict[str, Any] = {"start_s": round(time.perf_counter() - started, 1), "start_steps_s": stack.timings}
        token = credential("bench", "pro", 3600)
        client = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=120)
        for _ in range(3):  # warm-up
            pipeline_ttft(client, client.post("/v1/chats").json()["id"], "Hi.", 16)
        result["ttft"] = added_ttft(stack, client, args.pairs)
        enterprise = credential("bench-8", "enterprise", 3600)  # 8 at once is over a pro user's concurrency limit
        result["eight_chats"] = asyncio.run(eight_at_once(stack.api_url, enterprise, args.rounds))
        time.sleep(2)
        result["rss_mb"] = stack_memory(stack)
    except BaseException:
        stack.stop()
        raise
    return stack, result


class Streams:
    """Chat turns, `concurrency` at a time (one thread each), each thread noting when its tokens arrived and when
    each of its turns ended, and how."""

    def __init__(self, stack: Stack, concurrency: int = 3) -> None:
        self.stack, self.concurrency = stack, concurrency
        self.tokens: list[list[float]] = [[] for _ in range(concurrency)]
        self.ends: list[list[float]] = [[] for _ in range(concurrency)]
        self.outcomes: Counter[str] = Counter()
        self._running = True
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(concurrency)]

    def __enter__(self) -> Streams:
        for thread in self._threads:
            thread.start()
        return self

    def _loop(self, i: int) -> None:
        client = httpx.Client(
            base_url=self.stack.api_url,
            headers={"Authorization": f"Bearer {credential(f'b-{uuid.uuid4().hex[:6]}', 'pro', 3600)}"},
            timeout=httpx.Timeout(60, read=120),
        )
        while self._running:
            outcome = "broken"
            try:
                chats = ChatClient(client)
                run = chats.send(chats.new_chat(), STORY, max_tokens=200)
                self.tokens[i] += run.token_times
                if run.status != 200:
                    outcome = f"refused {run.status}"
                elif run.names and run.names[-1] in ("run.completed", "error"):
                    outcome = run.names[-1]
            except httpx.HTTPStatusError as exc:
                outcome = f"refused {exc.response.status_code}"
            except httpx.HTTPError as exc:
                outcome = f"broken ({type(exc).__name__})"
            self.ends[i].append(time.monotonic())
            self.outcomes[outcome] += 1
            if outcome != "run.completed":
                time.sleep(0.5)

    def answering(self, moment: float) -> list[int]:
        """The threads whose turn was mid-answer at `moment`: a token before it, and that turn not ended."""
        busy = []
        for i in range(self.concurrency):
            last_token = max((t for t in self.tokens[i] if t <= moment), default=None)
            if last_token is not None and not any(last_token <= e <= moment for e in self.ends[i]):
                busy.append(i)
        return busy

    def next_token(self, i: int, moment: float) -> float | None:
        return min((t for t in self.tokens[i] if t > moment), default=None)

    def __exit__(self, *exc: object) -> None:
        self._running = False
        for thread in self._threads:
            thread.join(180)


def broker_kills(stack: Stack, kills: int, window_s: float = 90.0) -> dict[str, object]:
    """Kill -9 the broker leading most of the reply partitions the first edge reads, while 3 chats stream. For
    each stream that was mid-answer at the kill: the time to its next token (None: none within `window_s`);
    and for each kill the time to the first token of any stream. Then restart the broker and wait until
    every partition has its 3 copies in sync again."""
    admin = AdminClient({"bootstrap.servers": CLUSTER.kafka_bootstrap})
    replies = named(TOKEN_DELTA, stack.namespace)
    owned = httpx.get(f"{stack.api_url}/readyz").json()["reply_partitions"]
    per_stream: list[float | None] = []
    any_stream: list[float | None] = []
    with Streams(stack) as streams:
        for _ in tqdm(range(kills), desc="broker kills", unit="kill"):
            deadline = time.monotonic() + 60
            while not streams.answering(time.monotonic()) and time.monotonic() < deadline:
                time.sleep(0.2)  # kill while answers stream
            leaders = admin.list_topics(replies, timeout=10).topics[replies].partitions
            leader = Counter(leaders[p].leader for p in owned).most_common(1)[0][0]
            node = next(b for b in CLUSTER.brokers(stack.state) if b.index == leader)
            killed = time.monotonic()
            os.kill(node.pid() or 0, signal.SIGKILL)
            busy = streams.answering(killed)
            deadline = killed + window_s
            while time.monotonic() < deadline and any(streams.next_token(i, killed) is None for i in busy):
                time.sleep(0.05)
            for i in busy:
                found = streams.next_token(i, killed)
                per_stream.append(round(found - killed, 3) if found is not None else None)
            first = min((t for i in range(streams.concurrency) if (t := streams.next_token(i, killed))), default=None)
            any_stream.append(round(first - killed, 3) if first is not None else None)
            time.sleep(5)  # delivery while the broker stays down
            node.sh("start")
            rejoined = time.monotonic() + 240
            while not all(
                len(p.isrs) == 3 for t in admin.list_topics(timeout=10).topics.values() for p in t.partitions.values()
            ):
                if time.monotonic() > rejoined:
                    raise RuntimeError(f"broker {node.index} did not rejoin every partition's in-sync set")
                time.sleep(0.5)

    def spread(values: list[float | None]) -> dict[str, object]:
        seen = sorted(v for v in values if v is not None)
        return {
            "p50": statistics.median(seen) if seen else None,
            "max": seen[-1] if seen else None,
            "n": len(values),
            f"none_within_{window_s:.0f}s": values.count(None),
            "all": values,
        }

    return {
        "kills": kills,
        "next_token_of_a_stream_mid_answer_s": spread(per_stream),
        "first_token_of_any_stream_s": spread(any_stream),
        "turn_outcomes": dict(streams.outcomes),
    }


def stored_turn(client: httpx.Client) -> None:
    """One chat turn, returning once both of its messages are stored; raises httpx.HTTPError on a refusal."""
    chats = ChatClient(client)
    chat = chats.new_chat()
    if (run := chats.send(chat, "Say hi.", max_tokens=8)).status != 200:
        raise httpx.HTTPError(f"chat {chat}: refused {run.status}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        listed = client.get(f"/v1/chats/{chat}/messages")
        listed.raise_for_status()
        if len(listed.json()["data"]) >= 2:
            return
        time.sleep(0.02)
    raise httpx.HTTPError(f"chat {chat}: the turn was not stored within 60 s")


def all_nodes_up(timeout_s: float = 180) -> bool:
    """Every Cassandra node is up as the cluster itself sees it (the driver follows the nodes' gossip)."""
    session = CqlCluster([n.host for n in CLUSTER.cassandra_nodes()], protocol_version=5).connect()
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(host.is_up for host in session.cluster.metadata.all_hosts()):
                return True
            time.sleep(0.5)
        return False
    finally:
        session.cluster.shutdown()


def node_kills(stack: Stack, kills: int) -> dict[str, object]:
    """Kill -9 a Cassandra node (not the seed), time until a chat turn sent right after is stored, count what
    was refused meanwhile, restart the node and wait until the cluster sees it up again."""
    token = credential(f"b-{uuid.uuid4().hex[:6]}", "pro", 3600)
    client = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=120)
    stored_after, refused = [], []
    for i in tqdm(range(kills), desc="cassandra node kills", unit="kill"):
        node = CLUSTER.cassandra_nodes()[1 + i % 2]
        killed = time.monotonic()
        os.kill(node.pid() or 0, signal.SIGKILL)
        while True:
            try:
                stored_turn(client)
                break
            except httpx.HTTPError as exc:
                status = exc.response.status_code if isinstance(exc, httpx.HTTPStatusError) else type(exc).__name__
                refused.append(f"{status} after {time.monotonic() - killed:.1f}s")
                time.sleep(0.2)
        stored_after.append(round(time.monotonic() - killed, 3))
        node.sh("start")
        if not all_nodes_up():
            raise RuntimeError(f"Cassandra node {node.host} did not rejoin")
    return {
        "kills": kills,
        "turn_stored_after_kill_s": {"p50": statistics.median(stored_after), "all": stored_after},
        "requests_refused_meanwhile": refused,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--node-kills", type=int, default=3)
    args = parser.parse_args()
    out = Path(__file__).parent / "results" / "cluster.json"
    result: dict[str, Any] = {"benchmark": "cluster", "args": vars(args), "complete": False}

    def save() -> None:  # after every phase, so a phase that fails leaves the ones before it on disk
        out.write_text(json.dumps(result, indent=2))

    stack, result["single_node"] = measure(SINGLE_NODE, args)
    save()
    stack.stop()  # the pipeline; the single node's Kafka and Cassandra may serve a `make up` stack too
    CLUSTER.wipe(stack.state)  # an empty cluster, as `parley up --cluster` gets on a new machine
    stack, result["cluster"] = measure(CLUSTER, args)
    cluster, single = result["cluster"], result["single_node"]

    def ratio(path: tuple[str, ...]) -> float:
        a, b = cluster, single
        for key in path:
            a, b = a[key], b[key]
        return round(a / b, 2)

    result["cluster_over_single"] = {
        "pipeline_added_ttft_p50": ratio(("ttft", "pipeline_added_ms", "p50")),
        "pipeline_added_ttft_p99": ratio(("ttft", "pipeline_added_ms", "p99")),
        "tokens_per_s_8_chats": ratio(("eight_chats", "tokens_per_s_median")),
        "rss_total": ratio(("rss_mb", "total")),
        "start_s": ratio(("start_s",)),
    }
    save()
    try:
        result["broker_failover"] = broker_kills(stack, args.kills)
        save()
        result["cassandra_failover"] = node_kills(stack, args.node_kills)
        result["complete"] = True
        save()
    finally:
        stack.stop()
        CLUSTER.wipe(stack.state)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
