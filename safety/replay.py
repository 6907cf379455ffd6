"""Replay a policy against past traffic: `python -m safety.replay policy.json [--namespace NS]`.

Reads every PromptModerated and OutputModerated event from the start of the topics, applies the policy in
the file (the body of PUT /v1/admin/safety/policies/{tier}) to the scores each event recorded, and prints
JSON: how many decisions each action got then and would get now, and the runs whose decision changes. No
model is run: the events carry the scores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections import Counter
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from registry import client as registry
from runtime import keys
from runtime.kafka_auth import client_config
from runtime.settings import StackSettings
from safety.policy import Decision, Policy, decide
from topics import codec
from topics.codec import Event
from topics.errors import PoisonEvent
from topics.pipeline import OUTPUT_MODERATED, PROMPT_MODERATED, Topic, named


def replayed(policy: Policy, schema: str, record: Event) -> tuple[str, str | None, Decision]:
    """(run id, the recorded action, the new policy's decision) for one event (pure). An output event is
    decided window by window, as it was live: the first window the new policy blocks decides."""
    if schema == "PromptModerated":
        return (
            record["prompt"]["run_id"],
            record.get("action"),
            decide(policy, "input", record.get("scores") or {}),
        )
    strictest = Decision(None, None, None)
    for window in record["windows"]:
        decision = decide(policy, "output", window["scores"])
        if decision.blocked:
            return record["run_id"], record.get("action"), decision
        if decision.action and strictest.action is None:
            strictest = decision
    return record["run_id"], record.get("action"), strictest


def events(
    bootstrap: str, topic: Topic[Any], namespace: str, timeout_s: float = 120.0
) -> list[Event]:
    """Every decodable record of the topic, from its start to its end when called (or what was read by
    timeout_s)."""
    name = named(topic, namespace)
    consumer = Consumer({**client_config(bootstrap), "group.id": f"replay-{uuid.uuid4().hex}"})
    try:
        meta = consumer.list_topics(name, timeout=10).topics[name]
        parts = [TopicPartition(name, p, 0) for p in meta.partitions]
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts}
        consumer.assign(parts)
        seen = dict.fromkeys(ends, 0)
        found = []
        deadline = time.monotonic() + timeout_s
        while any(seen[p] < ends[p] for p in ends) and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            seen[msg.partition() or 0] = (msg.offset() or 0) + 1
            try:
                found.append(codec.decode(topic.schema, msg.value()))
            except PoisonEvent:
                continue
        return found
    finally:
        consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("policy", help="a JSON file: {version, rules, on_error}")
    parser.add_argument("--namespace", default=None)
    parser.add_argument("--show", type=int, default=20, help="changed decisions to list")
    args = parser.parse_args()
    settings = StackSettings()
    registry.connect(settings.schema_registry_url)
    keys.start(settings, "api")
    namespace = settings.namespace if args.namespace is None else args.namespace
    policy = Policy(**json.loads(open(args.policy).read()))
    report: dict[str, Any] = {"policy_version": policy.version}
    for topic in (PROMPT_MODERATED, OUTPUT_MODERATED):
        before: Counter[str] = Counter()
        after: Counter[str] = Counter()
        changed: list[dict[str, Any]] = []
        for record in events(settings.kafka_bootstrap, topic, namespace):
            run_id, then, now = replayed(policy, topic.schema, record)
            before[then or "none"] += 1
            after[now.action or "none"] += 1
            if (then or None) != now.action:
                changed.append(
                    {"run_id": run_id, "then": then, "now": now.action, "category": now.category}
                )
        report[topic.schema] = {
            "events": sum(before.values()),
            "then": dict(before),
            "now": dict(after),
            "changed": len(changed),
            "examples": changed[: args.show],
        }
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
