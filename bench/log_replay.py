"""Topic replay: how fast a run is found in a deep log, and how fast recorded runs replay.

- Inspect: a real run of the stack (its every record across the topics) is copied into a scratch namespace
  twice: once stamped two days ago (the "old" run), once now (the "new" run), with --records SYNTHETIC
  PromptAccepted records (copies of real prompts under other run ids, stamped evenly between the two) in
  between. `history.find` (what `parley runs show` does) looks up each; the baseline, in the same run, is a scan
  of the prompt topic from offset 0 until the run is found (how safety/replay.py reads). Medians of --repeat.
- Replay: --runs real chat turns through the stack (4 at a time, the pro tier's limit; 8-token answers): their
  rate end to end is the live traffic's throughput on this machine. Then `parley replay` sends them through a
  moderation stage of its own under a stricter policy, and through a whole pipeline of its own (scheduler, an
  inference consumer and engine per pool) with 8-token answers: runs/s from its processes ready to the last
  result, and the command's wall time with their start-up.

Prints JSON and writes bench/results/log_replay.json. Usage: python bench/log_replay.py [--records 1000000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from confluent_kafka import Consumer, Producer, TopicPartition
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from api.auth import credential  # noqa: E402
from infra.stack import Stack  # noqa: E402
from registry import client as registry  # noqa: E402
from replay.client import ChatClient  # noqa: E402
from runtime.kafka import ensure_topics, producer_config  # noqa: E402
from runtime.window import Window  # noqa: E402
from storage import history  # noqa: E402
from storage.ids import UUID_EPOCH  # noqa: E402
from topics import codec  # noqa: E402
from topics.pipeline import PROMPT_ACCEPTED, named  # noqa: E402

PORT_BASE = 19500
DAY_MS = 86_400_000


def turn(client: httpx.Client, text: str, max_tokens: int = 8) -> str:
    """One chat turn; its run id if it completed, else "" (refused at the door or by the scheduler)."""
    chats = ChatClient(client)
    run = chats.send(chats.new_chat(), text, max_tokens=max_tokens)
    return run.run_id or "" if run.completed is not None else ""


def minted(at_ms: int) -> str:
    """A version-1 UUID minted at a given time (what the edge mints, back-dated)."""
    ticks = at_ms * 10_000 + UUID_EPOCH
    fields = (ticks & 0xFFFFFFFF, (ticks >> 32) & 0xFFFF, ((ticks >> 48) & 0x0FFF) | 0x1000, 0x80, 0x00, uuid.getnode())
    return str(uuid.UUID(fields=fields))


def rewritten(event: dict, run_id: str) -> dict:
    """A record of the template run, as if it were another run's."""
    copy = dict(event)
    if "prompt" in copy:
        copy["prompt"] = {**copy["prompt"], "run_id": run_id}
    if "run_id" in copy:
        copy["run_id"] = run_id
    return copy


def copy_run(producer: Producer, namespace: str, history: history.History, run_id: str, at_ms: int) -> None:
    start = min(r.timestamp_ms for r in history.records)
    for record in history.records:
        value = codec.encode(record.topic.schema, rewritten(record.event, run_id))
        producer.produce(
            named(record.topic, namespace),
            value=value,
            partition=record.partition,
            timestamp=at_ms + (record.timestamp_ms - start),
            headers=record.headers,
        )
    producer.flush(60)


def scan_from_zero(bootstrap: str, namespace: str, run_id: str) -> float:
    """The baseline: every partition of the prompt topic from offset 0 until the run is found (seconds)."""
    started = time.perf_counter()
    name = named(PROMPT_ACCEPTED, namespace)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"scan-{uuid.uuid4().hex}"})
    try:
        parts = consumer.list_topics(name, timeout=10).topics[name].partitions
        consumer.assign([TopicPartition(name, p, 0) for p in parts])
        while True:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            if codec.decode(PROMPT_ACCEPTED.schema, msg.value())["run_id"] == run_id:
                return time.perf_counter() - started
    finally:
        consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    stack = Stack(namespace=f"brp{uuid.uuid4().hex[:6]}", port_base=PORT_BASE)
    stack.up()
    registry.connect(stack.registry_url)
    settings = stack.settings
    out: dict = {"records_between": args.records, "machine": "2 cores (shared), single-node Kafka"}
    try:
        user = f"bench-{uuid.uuid4().hex[:6]}"
        client = httpx.Client(
            base_url=stack.api_url, headers={"Authorization": f"Bearer {credential(user, 'pro', 3600)}"}, timeout=120
        )
        texts = [f"Name a fruit, number {i}." for i in range(args.runs)]
        started = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:  # the pro tier's runs in flight
            live = [r for r in pool.map(lambda t: turn(client, t), texts) if r]
        live_s = time.perf_counter() - started
        out["live_runs"] = len(live)
        out["live_runs_per_s"] = round(len(live) / live_s, 2)

        # Inspect: the template is the first live run, read back whole.
        time.sleep(2)
        with Window(settings.kafka_bootstrap, settings.namespace) as window:
            template = history.find(window, live[0])
        scratch = f"{stack.namespace}-deep"
        ensure_topics(settings.kafka_bootstrap, scratch, settings.layout)
        producer = Producer(producer_config(settings.kafka_bootstrap, **{"linger.ms": 50, "batch.num.messages": 10000}))
        now = int(time.time() * 1000)
        old_at, new_at = now - 2 * DAY_MS, now - 60_000
        old_id, new_id = minted(old_at), minted(new_at)
        copy_run(producer, scratch, template, old_id, old_at)
        prompt = next(r for r in template.records if r.topic is PROMPT_ACCEPTED)
        fillers = [codec.encode(PROMPT_ACCEPTED.schema, rewritten(prompt.event, str(uuid.uuid1()))) for _ in range(500)]
        span = new_at - old_at - 120_000
        name = named(PROMPT_ACCEPTED, scratch)
        partitions = settings.layout.chat_partitions
        for i in tqdm(range(args.records), unit="record", desc="filling the log"):
            while True:
                try:
                    producer.produce(
                        name,
                        value=fillers[i % 500],
                        partition=i % partitions,
                        timestamp=old_at + 60_000 + span * i // args.records,
                    )
                    break
                except BufferError:
                    producer.poll(0.1)
        producer.flush(300)
        copy_run(producer, scratch, template, new_id, new_at)
        timings: dict[str, list[float]] = {"old": [], "new": [], "old_scan": [], "new_scan": []}
        for _ in range(args.repeat):
            for label, run_id in (("old", old_id), ("new", new_id)):
                t0 = time.perf_counter()
                with Window(settings.kafka_bootstrap, scratch) as window:
                    found = history.find(window, run_id)
                timings[label].append(time.perf_counter() - t0)
                assert len(found.records) == len(template.records), (len(found.records), len(template.records))
                timings[f"{label}_scan"].append(scan_from_zero(settings.kafka_bootstrap, scratch, run_id))
        med = {k: round(statistics.median(v) * 1000, 1) for k, v in timings.items()}
        t0 = time.perf_counter()
        cli = [
            sys.executable,
            "-m",
            "infra.cli",
            "runs",
            "show",
            old_id,
            "--no-stored",
            "--json",
            "--namespace",
            scratch,
            "--port-base",
            str(PORT_BASE),
        ]
        subprocess.run(cli, check=True, capture_output=True)
        out["inspect"] = {
            "events_per_run": len(template.records),
            "find_ms_median": {"today": med["new"], "two_days_and_1M_records_back": med["old"]},
            "scan_from_offset_0_ms_median": {"today": med["new_scan"], "two_days_and_1M_records_back": med["old_scan"]},
            "scan_over_find": {
                "today": round(med["new_scan"] / med["new"], 1),
                "old": round(med["old_scan"] / med["old"], 1),
            },
            "cli_wall_ms_old_run": round((time.perf_counter() - t0) * 1000, 1),
            "repeat": args.repeat,
        }
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
        mine = [t for t in admin.list_topics(timeout=10).topics if t.startswith(f"{scratch}.")]
        for future in admin.delete_topics(mine, operation_timeout=60).values():
            future.result()

        # Replay the live runs through moderation under a stricter policy.
        policy = Path(stack.state) / "bench-strict-policy.json"
        policy.write_text(
            json.dumps(
                {
                    "version": "bench-strict",
                    "rules": [{"stage": "input", "category": "toxic", "threshold": 0.2, "action": "block"}],
                }
            )
        )

        def replay(*extra: str) -> tuple[dict, float]:
            t0 = time.perf_counter()
            cli = [
                sys.executable,
                "-m",
                "infra.cli",
                "replay",
                "--user",
                user,
                "--since",
                "1h",
                "--json",
                "--quiet",
                "--namespace",
                stack.namespace,
                "--port-base",
                str(PORT_BASE),
                *extra,
            ]
            found = json.loads(subprocess.run(cli, check=True, capture_output=True, text=True).stdout)
            return found, round(time.perf_counter() - t0, 1)

        moderation, moderation_wall = replay("--policy", str(policy))
        pipeline, pipeline_wall = replay("--through", "pipeline", "--max-tokens", "8", "--temperature", "0")
        out["replay"] = {
            # every recorded run of the user: those the live burst completed and those its scheduler refused
            "runs": pipeline["runs"],
            "refused_live": sum(1 for r in pipeline["changed"] if (r["then"]["ended"] or "").startswith("rejected")),
            "live_runs_per_s_whole_pipeline": out["live_runs_per_s"],
            "moderation": {
                "runs_per_s": moderation["runs_per_s"],
                "wall_s_with_start": moderation_wall,
                "changed": moderation["summary"]["changed"],
            },
            "pipeline": {
                "runs_per_s": pipeline["runs_per_s"],
                "wall_s_with_start": pipeline_wall,
                "prompt_tokens_then_now": pipeline["summary"]["prompt_tokens"],
                "answer_similarity_mean": pipeline["summary"]["answer_similarity_mean"],
            },
        }
    finally:
        stack.stop()
    print(json.dumps(out, indent=2))
    (ROOT / "bench" / "results" / "log_replay.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
