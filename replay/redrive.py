"""`parley replay`: send recorded runs again through a real stage under a candidate configuration, in a
namespace of their own, and report what changes.

Selection reads the time window of the log the filters name (never from offset 0). The replay namespace
`<production>-replay-<id>` gets its own topics, its own consumer groups and the candidate policy on its own
policy table; the moderation stage that serves it is the production code (`python -m processors
moderation`) started with that namespace. The recorded PromptAccepted events are written there unchanged
(same run ids), and each PromptModerated the stage writes is compared with the one production recorded.
Nothing is written to a production topic, table or usage row.

A replay keeps its plan and each run's result under the state folder (replays/<id>/) as it goes, so an
interrupted replay resumes (`--resume ID`) with the runs it has no result for; its topics are deleted once
it is complete (unless --keep).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Consumer, Producer, TopicPartition
from tqdm import tqdm

from replay.runs import FIND_MS, GRACE_MS, minted_ms
from safety.policy import ANY_TIER, Policy, to_record
from topics import codec
from topics.errors import PoisonEvent
from topics.kafka import ensure_topics, producer_config
from topics.pipeline import (
    FEEDBACK,
    PROMPT_ACCEPTED,
    PROMPT_MODERATED,
    RUN_COMPLETED,
    RUN_REJECTED,
    SAFETY_POLICIES,
    named,
)
from topics.settings import REPO_ROOT, StackSettings, state_dir
from topics.window import Read, Window

ENDED_WITHIN_MS = 600_000  # a selected run's end is looked for this long after its window


class ReplayError(Exception):
    """A replay that cannot start: a bad file, an empty selection, a stage that would not come up."""


@dataclass(frozen=True)
class Selection:
    runs: tuple[str, ...] = ()
    chat: str | None = None
    user: str | None = None
    since_ms: int = 0
    until_ms: int = 0
    outcome: str | None = None
    feedback: str | None = None  # up | down
    limit: int = 0

    def window(self) -> tuple[int, int]:
        if self.runs:
            times = [minted_ms(r) for r in self.runs]
            return min(times) - FIND_MS, max(times) + FIND_MS
        return self.since_ms, self.until_ms


@dataclass
class Recorded:
    """A run as production recorded it: its prompt, its moderation verdict, how it ended, its rating."""

    prompt: dict[str, Any]
    moderated: dict[str, Any] | None = None
    ended: str | None = None
    rating: str | None = None

    def outcomes(self) -> set[str]:
        found = set()
        if self.moderated:
            found.add("blocked" if self.moderated["decision"] == "blocked" else "allowed")
            if self.moderated.get("action") == "warn":
                found.add("warned")
        if self.ended:
            kind, _, why = self.ended.partition(":")
            found.add(kind)
            if why == "content_filter" and kind == "completed":
                found.add("retracted")
            if why == "cancelled":
                found.add("cancelled")
        return found


def load_policy(path: str) -> Policy:
    """A policy file (the body of PUT /v1/admin/safety/policies/{tier}), or a clear error."""
    try:
        return Policy(**json.loads(Path(path).read_text()))
    except FileNotFoundError:
        raise ReplayError(f"no policy file {path}") from None
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise ReplayError(f"{path} is not a policy ({{version, rules, on_error}}): {exc}") from None


def select(window: Window, selection: Selection) -> list[Recorded]:
    """The recorded runs the filters match, in the order they were accepted."""
    since, until = selection.window()
    reads = [
        Read(PROMPT_ACCEPTED, since, until),
        Read(PROMPT_MODERATED, since, until + GRACE_MS),
        Read(RUN_COMPLETED, since, until + ENDED_WITHIN_MS),
        Read(RUN_REJECTED, since, until + ENDED_WITHIN_MS),
        Read(FEEDBACK, since, int(time.time() * 1000)),
    ]
    runs: dict[str, Recorded] = {}
    later: list[tuple[str, dict[str, Any]]] = []
    wanted = set(selection.runs)
    for record in window.read(reads):
        schema, event = record.topic.schema, record.event
        if schema == "PromptAccepted":
            if (wanted and event["run_id"] not in wanted) or event.get("summary"):
                continue
            if selection.chat and event["chat_id"] != selection.chat:
                continue
            if selection.user and event["user_id"] != selection.user:
                continue
            runs[event["run_id"]] = Recorded(event)
        else:
            later.append((schema, event))
    for schema, event in later:  # a chat's events are in order per partition; topics are read interleaved
        run = runs.get(event["message_id"] if schema == "Feedback" else run_of_event(event))
        if run is None:
            continue
        if schema == "PromptModerated":
            run.moderated = event
        elif schema == "RunCompleted":
            run.ended = f"completed:{event['finish_reason']}"
        elif schema == "RunRejected":
            run.ended = f"rejected:{event['code']}"
        elif schema == "Feedback":
            run.rating = event["rating"] if event["rating"] != "none" else None
    chosen = [
        r
        for r in runs.values()
        if (not selection.outcome or selection.outcome in r.outcomes())
        and (not selection.feedback or r.rating == selection.feedback)
    ]
    return chosen[: selection.limit] if selection.limit else chosen


def run_of_event(event: dict[str, Any]) -> str:
    return str(event.get("run_id") or event["prompt"]["run_id"])


def verdict(moderated: dict[str, Any] | None) -> dict[str, Any]:
    if moderated is None:
        return {"decision": None, "action": None, "category": None, "policy_version": None}
    keys = ("decision", "action", "category", "policy_version")
    return {k: moderated.get(k) for k in keys} | {"scores": moderated.get("scores") or {}}


def compared(run: Recorded, now: dict[str, Any]) -> dict[str, Any]:
    """One run's result: the verdict then and now, and whether the decision or action changed (pure)."""
    then, new = verdict(run.moderated), verdict(now)
    return {
        "run_id": run.prompt["run_id"],
        "chat_id": run.prompt["chat_id"],
        "user_id": run.prompt["user_id"],
        "content": run.prompt["content"][:200],
        "then": then,
        "now": new,
        "changed": (then["decision"], then["action"]) != (new["decision"], new["action"]),
    }


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts then and now per action, and each kind of flip (pure)."""
    then = Counter(r["then"]["action"] or "none" for r in results)
    now = Counter(r["now"]["action"] or "none" for r in results)

    def said(v: dict[str, Any]) -> str:
        return f"{v['decision']}/{v['action'] or 'none'}"

    flips = Counter(f"{said(r['then'])} -> {said(r['now'])}" for r in results if r["changed"])
    return {
        "then": dict(then),
        "now": dict(now),
        "changed": sum(r["changed"] for r in results),
        "flips": dict(flips),
        "newly_blocked": sum(r["changed"] and r["now"]["decision"] == "blocked" for r in results),
        "newly_allowed": sum(r["changed"] and r["now"]["decision"] == "allowed" for r in results),
    }


@dataclass
class Plan:
    id: str
    production: str  # the production namespace ('' for none)
    policy: dict[str, Any]
    selection: dict[str, Any]
    run_ids: list[str]
    created_at: float = field(default_factory=time.time)

    @property
    def namespace(self) -> str:
        return f"{self.production or 'parley'}-replay-{self.id}"

    @staticmethod
    def folder(replay_id: str) -> Path:
        return state_dir() / "replays" / replay_id

    def save(self) -> None:
        self.folder(self.id).mkdir(parents=True, exist_ok=True)
        (self.folder(self.id) / "plan.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, replay_id: str) -> Plan:
        path = cls.folder(replay_id) / "plan.json"
        if not path.exists():
            raise ReplayError(f"no replay {replay_id} to resume (looked in {path.parent})")
        return cls(**json.loads(path.read_text()))

    @property
    def results_file(self) -> Path:
        return self.folder(self.id) / "results.jsonl"

    def results(self) -> dict[str, dict[str, Any]]:
        if not self.results_file.exists():
            return {}
        lines = self.results_file.read_text().splitlines()
        return {r["run_id"]: r for r in map(json.loads, filter(None, lines))}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ModerationStage:
    """The production moderation stage, run as a process under the replay's namespace."""

    def __init__(self, plan: Plan, settings: StackSettings) -> None:
        self.port = _free_port()
        self.log = Plan.folder(plan.id) / "moderation.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_EXPORTER_OTLP")}
        env |= {
            "PARLEY_NAMESPACE": plan.namespace,
            "PARLEY_WEB_PORT": str(self.port),
            "PARLEY_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "PARLEY_SCHEMA_REGISTRY_URL": settings.schema_registry_url,
            "PARLEY_KAFKA_REPLICATION_FACTOR": str(settings.kafka_replication_factor),
            "PARLEY_KAFKA_MIN_INSYNC_REPLICAS": str(settings.kafka_min_insync_replicas),
            "PYTHONUNBUFFERED": "1",
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "processors", "moderation"],
            cwd=REPO_ROOT,
            env=env,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ReplayError(f"the replay's moderation stage exited:\n{self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise ReplayError(f"the replay's moderation stage was not ready in {timeout_s:.0f} s (log: {self.log})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


class Replay:
    def __init__(self, plan: Plan, settings: StackSettings, progress: bool = True) -> None:
        self.plan, self.settings, self.progress = plan, settings, progress

    def run(self, runs: list[Recorded], keep: bool = False) -> dict[str, Any]:
        """Moderate every run not yet replayed under the candidate policy; returns the report."""
        plan, settings = self.plan, self.settings
        done = plan.results()
        pending = [r for r in runs if r.prompt["run_id"] not in done]
        started = time.monotonic()
        if pending:
            ensure_topics(settings.kafka_bootstrap, plan.namespace, settings.layout)
            self._publish_policy()
            stage = ModerationStage(plan, settings)
            try:
                stage.wait_ready()
                started = time.monotonic()
                self._send(pending)
                self._collect({r.prompt["run_id"]: r for r in pending})
            finally:
                stage.stop()
        took = time.monotonic() - started
        results = list(plan.results().values())
        missing = sorted(set(plan.run_ids) - {r["run_id"] for r in results})
        if not missing and not keep:
            self.drop_topics()
        report = {
            "replay_id": plan.id,
            "namespace": plan.namespace,
            "through": "moderation",
            "policy_version": plan.policy["version"],
            "runs": len(results),
            "changed": [r for r in results if r["changed"]],
            "summary": summary(results),
            "missing": missing,
            "runs_per_s": round(len(pending) / took, 2) if pending and took > 0 else None,
        }
        return report

    def _publish_policy(self) -> None:
        producer = Producer(producer_config(self.settings.kafka_bootstrap))
        record = to_record(ANY_TIER, Policy(**self.plan.policy), "replay")
        name = named(SAFETY_POLICIES, self.plan.namespace)
        producer.produce(name, key=ANY_TIER, value=codec.encode(SAFETY_POLICIES.schema, record))
        if producer.flush(30):
            raise ReplayError(f"could not write the candidate policy to {name}")

    def _send(self, runs: list[Recorded]) -> None:
        producer = Producer(producer_config(self.settings.kafka_bootstrap))
        name = named(PROMPT_ACCEPTED, self.plan.namespace)
        for run in runs:
            prompt = run.prompt
            producer.produce(name, key=prompt["chat_id"], value=codec.encode(PROMPT_ACCEPTED.schema, prompt))
            producer.poll(0)
        if producer.flush(60):
            raise ReplayError("could not write the replayed prompts")

    def _collect(self, pending: dict[str, Recorded], quiet_s: float = 120.0) -> None:
        """Read the replay's verdicts until each pending run has one, or none came for quiet_s."""
        name = named(PROMPT_MODERATED, self.plan.namespace)
        consumer = Consumer(
            {"bootstrap.servers": self.settings.kafka_bootstrap, "group.id": f"{self.plan.namespace}.collect"}
        )
        parts = consumer.list_topics(name, timeout=10).topics[name].partitions
        consumer.assign([TopicPartition(name, p, 0) for p in parts])
        last = time.monotonic()
        try:
            with (
                self.plan.results_file.open("a") as out,
                tqdm(total=len(pending), unit="run", desc="replaying", disable=not self.progress) as bar,
            ):
                while pending and time.monotonic() - last < quiet_s:
                    msg = consumer.poll(0.5)
                    if msg is None or msg.error():
                        continue
                    try:
                        event = codec.decode(PROMPT_MODERATED.schema, msg.value())
                    except PoisonEvent:
                        continue
                    run = pending.pop(event["prompt"]["run_id"], None)
                    if run is None:
                        continue
                    out.write(json.dumps(compared(run, event), default=str) + "\n")
                    out.flush()
                    bar.update(1)
                    last = time.monotonic()
        finally:
            consumer.close()

    def drop_topics(self) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.settings.kafka_bootstrap})
        prefix = f"{self.plan.namespace}."
        mine = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
        for future in admin.delete_topics(mine, operation_timeout=30).values() if mine else ():
            future.result()


def new_plan(settings: StackSettings, policy: Policy, selection: Selection, runs: list[Recorded]) -> Plan:
    plan = Plan(
        id=uuid.uuid4().hex[:10],
        production=settings.namespace,
        policy=policy.model_dump(),
        selection=asdict(selection),
        run_ids=[r.prompt["run_id"] for r in runs],
    )
    plan.save()
    return plan


def recorded_again(window: Window, plan: Plan) -> list[Recorded]:
    """The plan's runs, read again from the log (a resumed replay keeps no copy of production events)."""
    selection = Selection(runs=tuple(plan.run_ids))
    return select(window, selection)
