"""Pipeline-added time to first token, and the local stack's steady-state memory.

For each of N prompts, in random order, the same request goes (a) straight to the engine (llama-server's
/v1/chat/completions, same messages and max_tokens) and (b) through the whole pipeline (edge -> Kafka ->
moderation -> scheduling -> inference -> Kafka -> edge -> SSE). Pipeline-added TTFT = (b) - (a) per pair.
Before each pair the prompt is sent once to the engine, so both measurements find it in the engine's prompt
cache (llama-server reuses a slot's cached prefix; otherwise whichever goes second gains 40-140 ms), and
which of the two goes first is random per pair.

Where the added time goes, per run, from the records the run left in the log (the stack's own namespace is
read whole afterwards): each record's Kafka timestamp is when its producer sent it, and the inference
consumer's RunCompleted says how long the run waited there (queue_ms, from scheduled_at) and how long the
engine took to its first token (ttft_ms, request to first token as that consumer's client saw it). Hops:

    edge        the client's request -> the edge publishes PromptAccepted (auth, chat read, door, run opened)
    moderation  PromptAccepted sent -> PromptModerated sent (Kafka, the stage, its classifier)
    scheduling  PromptModerated sent -> RunScheduled sent (Kafka, context, ledger, placement)
    dispatch    RunScheduled built -> the engine request (Kafka, the consumer's queue)
    engine      the engine request -> its first token (ttft_ms; the engine alone: engine_ttft_ms)
    publish     the first token -> the first TokenDelta record sent (the coalescer)
    reply       the first TokenDelta sent -> the client reads the token (Kafka, the edge, SSE)

Also each process's CPU: at rest (ms per second) and per pair beyond that.

Runs its own stack under a fresh namespace and port base; prints JSON and writes bench/results/.
Usage: python bench/pipeline_ttft.py [--requests 100] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Consumer, TopicPartition
from measure import pct, summary
from procstat import cpu_use, stack_cpu, stack_memory
from tqdm import tqdm

from api.auth import credential
from infra import traces
from infra.stack import Stack
from processors.settings import ProcessorSettings
from registry import client as registry
from replay.client import ChatClient
from topics import codec
from topics.pipeline import PROMPT_ACCEPTED, PROMPT_MODERATED, RUN_COMPLETED, RUN_SCHEDULED, TOKEN_DELTA, Topic, named

PROMPTS = [
    "Say hello.",
    "Name a fruit.",
    "What is two plus two?",
    "Give me a colour.",
    "Say something kind.",
    "Name an animal.",
    "What day comes after Monday?",
    "Name a planet.",
    "Say thanks in Spanish.",
    "Name a musical instrument.",
]


def engine_ttft(client: httpx.Client, url: str, messages: list[dict], max_tokens: int) -> float:
    """Same retry as the inference consumer's client: cpp-httplib closes a connection after 100 requests."""
    try:
        return _engine_ttft(client, url, messages, max_tokens)
    except httpx.RemoteProtocolError:
        return _engine_ttft(client, url, messages, max_tokens)


def _engine_ttft(client: httpx.Client, url: str, messages: list[dict], max_tokens: int) -> float:
    # read to the end, as the pipeline's consumer does
    run = ChatClient(client, base=url).complete(
        messages, model="smollm2-135m-instruct", max_tokens=max_tokens, temperature=0.7
    )
    if run.ttft_s is None:
        raise RuntimeError("engine produced no token")
    return run.ttft_s * 1000


@dataclass
class Sent:
    """One request through the pipeline: its TTFT, its run, and when (epoch ms) it left and its token came."""

    ttft_ms: float
    run_id: str
    sent_ms: float
    first_ms: float


def pipeline_ttft(client: httpx.Client, chat_id: str, content: str, max_tokens: int) -> Sent:
    sent_ms = time.time() * 1000
    run = ChatClient(client).send(chat_id, content, max_tokens=max_tokens)
    if run.ttft_s is None or not run.token_times:
        raise RuntimeError("pipeline produced no token")
    # the token's epoch ms: the monotonic clock's reading carried over to the wall clock of this process
    first_ms = (time.time() - (time.monotonic() - run.token_times[0])) * 1000
    return Sent(run.ttft_s * 1000, run.run_id or "", sent_ms, first_ms)


def log_records(bootstrap: str, namespace: str, topics: list[Topic[Any]]) -> dict[str, list[tuple[dict, float]]]:
    """Every record of the namespace's topics, decoded, with its Kafka timestamp (ms), by topic name."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}"})
    out: dict[str, list[tuple[dict, float]]] = {}
    for topic in topics:
        name = named(topic, namespace)
        parts = consumer.list_topics(name, timeout=10).topics[name].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)[1] for p in parts}
        consumer.assign([TopicPartition(name, p, 0) for p in parts if ends[p] > 0])
        left, found = {p for p in parts if ends[p] > 0}, []
        deadline = time.monotonic() + 60
        while left and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            found.append((codec.decode(topic.schema, msg.value()), float(msg.timestamp()[1])))
            if msg.offset() + 1 >= ends[msg.partition()]:
                left.discard(msg.partition())
        out[topic.name] = found
    consumer.close()
    return out


HOPS = ("edge", "moderation", "scheduling", "dispatch", "engine", "publish", "reply")


def hops(runs: list[Sent], bootstrap: str, namespace: str) -> dict[str, list[float]]:
    """Each run's time per hop (module docstring), from its records in the log."""
    scheduled = RUN_SCHEDULED["small"]
    log = log_records(bootstrap, namespace, [PROMPT_ACCEPTED, PROMPT_MODERATED, scheduled, RUN_COMPLETED, TOKEN_DELTA])
    accepted = {r["run_id"]: ts for r, ts in log[PROMPT_ACCEPTED.name]}
    moderated = {r["prompt"]["run_id"]: ts for r, ts in log[PROMPT_MODERATED.name]}
    placed = {r["prompt"]["run_id"]: (r["scheduled_at"], ts) for r, ts in log[scheduled.name]}
    completed = {r["prompt"]["run_id"]: r for r, _ in log[RUN_COMPLETED.name]}
    first_delta: dict[str, float] = {}
    for r, ts in log[TOKEN_DELTA.name]:
        if r["kind"] == "delta" and r["text"]:
            first_delta[r["run_id"]] = min(ts, first_delta.get(r["run_id"], ts))
    out: dict[str, list[float]] = {hop: [] for hop in HOPS}
    for run in runs:
        rid = run.run_id
        if not all(rid in table for table in (accepted, moderated, placed, completed, first_delta)):
            continue
        built_ms, placed_ms = placed[rid]
        request_ms = built_ms + completed[rid]["queue_ms"]
        token_ms = request_ms + completed[rid]["ttft_ms"]
        for hop, value in zip(
            HOPS,
            (
                accepted[rid] - run.sent_ms,
                moderated[rid] - accepted[rid],
                placed_ms - moderated[rid],
                request_ms - built_ms,
                token_ms - request_ms,
                first_delta[rid] - token_ms,
                run.first_ms - first_delta[rid],
            ),
            strict=True,
        ):
            out[hop].append(value)
    return out


def floors(stack: Stack, n: int = 200) -> dict[str, Any]:
    """What the path's parts cost alone on this machine, measured in the same run on the same (now idle) stack,
    p50/p99 of n each: one Kafka hop (a record produced with the pipeline's producer settings, acks=all and
    idempotent, until a consumer polling its partition has it; the stages' aiokafka clients cost more), a
    Cassandra read and a compare-and-set like the ledger's (one row, LOCAL_SERIAL: Paxos), and the input check
    on a short turn (the moderation stage's encoder, heads and policy, in this process). The path to a first
    token crosses four Kafka hops (accepted, moderated, scheduled, the first delta) and makes one ledger read,
    one compare-and-set and one input check; `path_p50_ms` adds those medians up."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from runtime.kafka import producer_config
    from safety.moderator import Moderator
    from safety.policy import BUILTIN
    from storage.session import connect_session

    bootstrap = stack.settings.kafka_bootstrap
    topic = f"{stack.namespace}.bench-floor"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer(producer_config(bootstrap))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{stack.namespace}.floor"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    kafka = []
    try:
        for i in range(n + 10):
            started = time.perf_counter()
            producer.produce(topic, value=str(i).encode())
            producer.poll(0)
            while True:
                msg = consumer.poll(0.5)
                if msg is not None and not msg.error() and msg.value() == str(i).encode():
                    break
            kafka.append((time.perf_counter() - started) * 1000)
            producer.poll(0)
    finally:
        producer.flush(10)
        consumer.close()
        admin.delete_topics([topic])
    session = connect_session(stack.settings.cassandra)
    ks = stack.settings.keyspace_name
    read = session.prepare(f"SELECT version FROM {ks}.budgets WHERE user_id = ? LIMIT 1")
    cas = session.prepare(f"UPDATE {ks}.budgets SET version = ? WHERE user_id = ? IF version = ?")
    user = f"floor-{uuid.uuid4().hex[:8]}"
    session.execute(f"UPDATE {ks}.budgets SET version = 0 WHERE user_id = %s", (user,))
    reads, writes = [], []
    for v in range(n + 10):
        started = time.perf_counter()
        session.execute(read, (user,)).one()
        reads.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        assert session.execute(cas, (v + 1, user, v)).one()[0]
        writes.append((time.perf_counter() - started) * 1000)
    session.execute(f"DELETE FROM {ks}.budgets WHERE user_id = %s", (user,))
    session.cluster.shutdown()
    moderator = Moderator()
    checks = []
    for i in range(n + 10):
        started = time.perf_counter()
        moderator.check(BUILTIN, "input", [f"{PROMPTS[i % len(PROMPTS)]} ({i})"])
        checks.append((time.perf_counter() - started) * 1000)
    parts = {
        "kafka_hop": kafka[10:],
        "cassandra_read": reads[10:],
        "cassandra_compare_and_set": writes[10:],
        "input_check": checks[10:],
    }
    out: dict[str, Any] = {name: summary(v) for name, v in parts.items()}
    medians = {name: statistics.median(v) for name, v in parts.items()}
    out["path_p50_ms"] = round(
        4 * medians["kafka_hop"]
        + medians["cassandra_read"]
        + medians["cassandra_compare_and_set"]
        + medians["input_check"],
        2,
    )
    return out


SPAN_GAPS = {  # what: (from span, its end or start) -> (to span, its start or end), from each run's trace
    "edge_before_publish": (("POST /v1/chats/{chat_id}/messages", 0), ("accept prompt", 0)),
    "edge_publish": (("accept prompt", 0), ("accept prompt", 1)),
    "to_moderation": (("accept prompt", 1), ("moderation chat.prompt-accepted.v1", 0)),
    "moderation_handler": (("moderation chat.prompt-accepted.v1", 0), ("moderation chat.prompt-accepted.v1", 1)),
    "to_scheduling": (("moderation chat.prompt-accepted.v1", 1), ("scheduling chat.prompt-moderated.v1", 0)),
    "scheduling_handler": (("scheduling chat.prompt-moderated.v1", 0), ("scheduling chat.prompt-moderated.v1", 1)),
}


def span_gaps(spans_file: Path, run_ids: set[str]) -> dict[str, dict[str, float | None]]:
    """Inside the edge, moderation and scheduling hops, from the spans each process exported (ms): the edge's
    work before it publishes and the publish itself, each stage's handler, and the deliveries between them
    (a record sent until the stage's handler starts: Kafka, aiokafka and faust)."""
    times: dict[str, dict[str, tuple[float, float]]] = {}
    runs: set[str] = set()  # the traces that carry one of these runs
    for span in traces.spans(spans_file):
        start, end = int(span["startTimeUnixNano"]) / 1e6, int(span["endTimeUnixNano"]) / 1e6
        times.setdefault(span["traceId"], {})[span["name"]] = (start, end)
        if span["attrs"].get("parley.run_id") in run_ids:
            runs.add(span["traceId"])
    gaps: dict[str, list[float]] = {name: [] for name in SPAN_GAPS}
    for trace in runs:
        spans = times[trace]
        for name, ((a, i), (b, j)) in SPAN_GAPS.items():
            if a in spans and b in spans:
                gaps[name].append(spans[b][j] - spans[a][i])
    return {name: summary(values) for name, values in gaps.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--port-base", type=int, default=28000)
    args = parser.parse_args()

    stack = Stack(namespace=f"bench{uuid.uuid4().hex[:6]}", port_base=args.port_base)
    stack.up()
    registry.connect(stack.registry_url)  # the log's records are read back for the per-hop times
    try:
        token = credential("bench", "pro", 30 * 86_400)
        api = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=120)
        engine = httpx.Client(timeout=120, headers=stack.engine_headers())
        engine_url = stack.engine_url()
        system = ProcessorSettings().system_prompt
        rng = random.Random(7)
        for _ in range(3):  # warm-up, both paths
            chat = api.post("/v1/chats").json()["id"]
            pipeline_ttft(api, chat, "Hi.", args.max_tokens)
            engine_ttft(
                engine,
                engine_url,
                [{"role": "system", "content": system}, {"role": "user", "content": "Hi."}],
                args.max_tokens,
            )
        time.sleep(3)  # the warm-up's stored and embedded answers
        idle_from, idle_at = stack_cpu(stack), time.monotonic()
        time.sleep(10)
        idle = cpu_use(idle_from, stack_cpu(stack), time.monotonic() - idle_at, None, 0)
        busy_from, busy_at = stack_cpu(stack), time.monotonic()
        pairs, runs = [], []
        for i in tqdm(range(args.requests), desc="pairs", unit="pair", mininterval=5):
            content = f"{PROMPTS[i % len(PROMPTS)]} ({i})"
            messages = [{"role": "system", "content": system}, {"role": "user", "content": content}]
            chat = api.post("/v1/chats").json()["id"]
            engine_ttft(engine, engine_url, messages, args.max_tokens)  # prime the prompt cache
            engine_first = rng.random() < 0.5
            if engine_first:
                e = engine_ttft(engine, engine_url, messages, args.max_tokens)
                sent = pipeline_ttft(api, chat, content, args.max_tokens)
            else:
                sent = pipeline_ttft(api, chat, content, args.max_tokens)
                e = engine_ttft(engine, engine_url, messages, args.max_tokens)
            pairs.append((sent.ttft_ms, e, engine_first))
            runs.append(sent)
        time.sleep(2)
        busy = cpu_use(busy_from, stack_cpu(stack), time.monotonic() - busy_at, idle, len(pairs))
        memory = stack_memory(stack)
        shares = stack_memory(stack, "Pss")
        per_hop = hops(runs, stack.settings.kafka_bootstrap, stack.namespace)
        time.sleep(2)  # the collector writes its batch
        inside = span_gaps(stack.spans_file, {r.run_id for r in runs})
        parts = floors(stack)
    finally:
        stack.stop()
        stack.forget()  # its topics and keyspace

    added = [p - e for p, e, _ in pairs]
    result = {
        "benchmark": "pipeline_added_ttft",
        "requests": len(pairs),
        "max_tokens": args.max_tokens,
        "pipeline_ttft_ms": summary([p for p, _, _ in pairs]),
        "engine_ttft_ms": summary([e for _, e, _ in pairs]),
        "pipeline_added_ttft_ms": summary(added),
        "added_when_engine_first_ms": summary([p - e for p, e, f in pairs if f]),
        "added_when_pipeline_first_ms": summary([p - e for p, e, f in pairs if not f]),
        "ratio_pipeline_to_engine_p50": round(pct([p for p, _, _ in pairs], 50) / pct([e for _, e, _ in pairs], 50), 2),
        # Per hop (module docstring); "engine" is the engine's TTFT as the inference consumer saw it, so
        # engine_client_overhead_ms is its p50 less the engine alone's.
        "hops_ms": {hop: summary(values) for hop, values in per_hop.items()},
        "inside_hops_ms": inside,
        "engine_client_overhead_p50_ms": round(pct(per_hop["engine"], 50) - pct([e for _, e, _ in pairs], 50), 2)
        if per_hop["engine"]
        else None,
        # What the path's parts cost alone here (floors): the least the pipeline can add on this machine.
        "floors_ms": parts,
        # CPU per process: ms per second with nothing to do, and ms per pair beyond that (the engine's row holds
        # both requests of a pair; the stages' rows include the work after the first token: storing, metering,
        # embedding, output moderation). On a 2-core box every stage competes with the path for these.
        "idle_cpu_ms_per_s": idle,
        "cpu_ms_per_pair": busy,
        "stack_rss_mb": memory,
        "stack_pss_mb": shares,
        "stack_start_s": stack.timings,
    }
    out = Path(__file__).parent / "results" / "pipeline_ttft.json"
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
