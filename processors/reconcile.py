"""Usage rebuilt from the log and compared with ClickHouse: `parley usage reconcile --since ... --until ...`.

The topics are the record (docs/decisions/0003-delivery-guarantees.md): every run ends in one RunCompleted or
RunRejected, and the metering stage turns each into a row with the same functions used here. Reconciliation
reads both topics for a time range (from the offsets Kafka finds for its start, to the end of the log),
rebuilds the rows, asks the metering stage for the rows it holds in that range, and reports drift: runs
missing from ClickHouse, rows ClickHouse holds that the log does not, rows whose tokens or outcome differ, and
rollup buckets (hours, days) whose sums differ from the rows. `--repair` sends the missing rows to the
metering stage (which writes them like any batch), then recomputes the rollup buckets that still differ from
the rows.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
from confluent_kafka import Consumer, KafkaError, TopicPartition
from tqdm import tqdm

from processors.meter_usage import Prices, usage_row
from runtime.kafka_auth import client_config
from runtime.settings import StackSettings
from storage.usage import COMPARED
from topics import codec
from topics.errors import PoisonEvent
from topics.pipeline import RUN_COMPLETED, RUN_REJECTED, Topic, named

SLACK_MS = (
    5 * 60_000
)  # events are read from this long before the range: a run's end time precedes its append


@dataclass
class Drift:
    since: int
    until: int
    log_runs: int = 0
    stored_runs: int = 0
    undecodable: int = 0
    missing: list[str] = field(default_factory=list)  # run ids in the log, not in ClickHouse
    extra: list[str] = field(default_factory=list)  # run ids in ClickHouse, not in the log
    mismatched: list[dict[str, Any]] = field(default_factory=list)
    rollup_buckets: list[dict[str, Any]] = field(
        default_factory=list
    )  # hours, days: sums unlike the rows
    log_tokens: dict[str, int] = field(default_factory=dict)
    stored_tokens: dict[str, int] = field(default_factory=dict)
    repaired: int = 0

    @property
    def zero(self) -> bool:
        return not (self.missing or self.extra or self.mismatched or self.rollup_buckets)

    def summary(self, sample: int = 20) -> dict[str, Any]:
        return {
            "since": self.since,
            "until": self.until,
            "log_runs": self.log_runs,
            "stored_runs": self.stored_runs,
            "undecodable_events": self.undecodable,
            "missing": len(self.missing),
            "extra": len(self.extra),
            "mismatched": len(self.mismatched),
            "rollup_buckets_off": len(self.rollup_buckets),
            "log_tokens": self.log_tokens,
            "stored_tokens": self.stored_tokens,
            "repaired": self.repaired,
            "drift": not self.zero,
            "examples": {
                "missing": self.missing[:sample],
                "extra": self.extra[:sample],
                "mismatched": self.mismatched[:sample],
                "rollup_buckets": self.rollup_buckets[:sample],
            },
        }


def read_log(
    bootstrap: str,
    namespace: str,
    since_ms: int,
    until_ms: int,
    prices: Prices,
    progress: bool = True,
) -> tuple[dict[str, dict[str, Any]], int]:
    """The usage rows the log says runs in [since, until) produced, by run id (the first event of a run wins,
    as in ClickHouse), and how many events could not be decoded (those sit in the dead-letter topic)."""
    consumer = Consumer(
        {
            **client_config(bootstrap),
            "group.id": f"parley-reconcile-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    rows: dict[str, dict[str, Any]] = {}
    bad = 0
    try:
        topics: dict[str, Topic[Any]] = {}
        wanted: list[TopicPartition] = []
        for topic in (RUN_COMPLETED, RUN_REJECTED):
            name = named(topic, namespace)
            topics[name] = topic
            meta = consumer.list_topics(name, timeout=10).topics[name]
            wanted += [TopicPartition(name, p, since_ms - SLACK_MS) for p in meta.partitions]
        starts = consumer.offsets_for_times(wanted, timeout=10)
        ends: dict[tuple[str, int], int] = {}
        assign = []
        for tp in starts:
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            start = tp.offset if tp.offset >= 0 else high  # -1: nothing at or after that time
            if start < high:
                ends[(tp.topic, tp.partition)] = high
                assign.append(TopicPartition(tp.topic, tp.partition, max(start, low)))
        total = sum(ends[(tp.topic, tp.partition)] - tp.offset for tp in assign)
        consumer.assign(assign)
        with tqdm(total=total, unit="event", desc="reading the log", disable=not progress) as bar:
            while ends:
                msg = consumer.poll(1.0)
                if msg is None:
                    continue
                name, partition, offset = (
                    str(msg.topic()),
                    int(msg.partition() or 0),
                    int(msg.offset() or 0),
                )
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        ends.pop((name, partition), None)
                    continue
                bar.update(1)
                if (name, partition) in ends and offset >= ends[(name, partition)] - 1:
                    ends.pop((name, partition))
                topic = topics[name]
                try:
                    event = codec.decode(topic.schema, msg.value())
                except PoisonEvent:
                    bad += 1
                    continue
                row, ended_ms = usage_row(topic, event, prices)
                if since_ms <= ended_ms < until_ms:
                    rows.setdefault(row["run_id"], row)
    finally:
        consumer.close()
    return rows, bad


def tokens(rows: Any) -> dict[str, int]:
    out = {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}
    for r in rows:
        for k in out:
            out[k] += int(r[k])
    return out


def compare(
    log: dict[str, dict[str, Any]], stored: list[dict[str, Any]], since: int, until: int
) -> Drift:
    """Drift between the rows rebuilt from the log and the stored ones (pure)."""
    drift = Drift(since, until, log_runs=len(log), stored_runs=len(stored))
    held = {r["run_id"]: r for r in stored}
    drift.missing = sorted(set(log) - set(held))
    drift.extra = sorted(set(held) - set(log))
    for run_id in sorted(set(log) & set(held)):
        erased = str(held[run_id]["user_id"]).startswith("erased-")  # moved under a pseudonym
        diff = {
            k: (log[run_id][k], held[run_id][k])
            for k in COMPARED
            if str(log[run_id][k]) != str(held[run_id][k]) and not (erased and k == "user_id")
        }
        if diff:
            drift.mismatched.append({"run_id": run_id, "log_vs_stored": diff})
    drift.log_tokens, drift.stored_tokens = tokens(log.values()), tokens(stored)
    return drift


def reconcile(
    bootstrap: str,
    namespace: str,
    metering_url: str,
    since_ms: int,
    until_ms: int,
    prices: Prices,
    repair: bool = False,
    progress: bool = True,
) -> Drift:
    log_rows, bad = read_log(bootstrap, namespace, since_ms, until_ms, prices, progress)
    params = {"since": since_ms, "until": until_ms}
    with httpx.Client(
        base_url=metering_url, headers=StackSettings().internal_headers(), timeout=120
    ) as http:

        def stored() -> list[dict[str, Any]]:
            response = http.get("/usage-range", params=params)
            response.raise_for_status()
            return list(response.json()["data"])

        def rollups_off() -> list[dict[str, Any]]:
            response = http.get("/usage-rollup-check", params=params)
            response.raise_for_status()
            return list(response.json()["data"])

        drift = compare(log_rows, stored(), since_ms, until_ms)
        repaired = 0
        if repair and drift.missing:
            rows = [log_rows[run_id] for run_id in drift.missing]
            response = http.post("/usage-repair", json={"rows": rows})
            response.raise_for_status()
            repaired = int(response.json()["written"])
            drift = compare(log_rows, stored(), since_ms, until_ms)
        drift.repaired = repaired
        drift.rollup_buckets = rollups_off()
        if repair and drift.rollup_buckets:
            http.post("/usage-rollup-rebuild", json=params).raise_for_status()
            drift.rollup_buckets = rollups_off()
    drift.undecodable = bad
    return drift
