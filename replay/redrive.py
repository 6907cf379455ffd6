"""`parley replay`: send recorded runs again through the real stages under a candidate configuration, in a
namespace of their own, and report what changes.

Selection reads the time window of the log the filters name (never from offset 0). The candidate's namespace
(replay/candidate.py) gets its own topics, consumer groups, tables and (whole pipeline) keyspace; its
processes are the production code. The recorded PromptAccepted events are written there (same run ids, the
candidate's model and sampling), and what the stages write is compared with what production recorded:
`--through moderation` the verdicts, `--through pipeline` also the pool, the prompt's tokens, the answer
(similarity), its tokens, TTFT and finish. Nothing is written to a production topic, table or usage row.

A replay keeps its plan and each run's result under the state folder (replays/<id>/) as it goes, so an
interrupted replay resumes (`--resume ID`) with the runs it has no result for; its topics and keyspace are
deleted once it is complete (unless --keep).
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from confluent_kafka import Consumer, TopicPartition
from tqdm import tqdm

from replay import candidate as cand
from replay.candidate import Candidate
from replay.compare import compared, summary
from replay.selection import Recorded, Selection, select
from runtime.kafka import Publisher
from runtime.kafka_auth import client_config
from runtime.settings import StackSettings, state_dir
from runtime.window import Window
from storage.history import minted_ms, run_of
from topics import codec
from topics.errors import PoisonEvent
from topics.events import PromptAccepted
from topics.pipeline import (
    PROMPT_ACCEPTED,
    PROMPT_MODERATED,
    RUN_COMPLETED,
    RUN_REJECTED,
    RUN_SCHEDULED,
    Topic,
    named,
)


class ReplayError(Exception):
    """A replay that cannot start: a bad file, an empty selection, a stage that would not come up."""


@dataclass
class Plan:
    id: str
    production: str  # the production namespace ('' for none)
    candidate: dict[str, Any]
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


def free_port_base(start: int = 20_000) -> int:
    """A port base whose edge, stage and consumer ports (base, base+10..14, base+20..29) are all free."""
    for base in range(start, 60_000, 100):
        if all(_free(base + offset) for offset in (0, *range(10, 15), *range(20, 30))):
            return base
    raise ReplayError("no free ports for the replay's processes")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


class Replay:
    def __init__(
        self,
        plan: Plan,
        settings: StackSettings,
        launch: cand.Launch,
        progress: bool = True,
        stopped: Callable[[], bool] = lambda: False,
    ) -> None:
        self.plan, self.settings, self.progress = plan, settings, progress
        self.launch = launch  # starts the candidate's processes (infra.stack.Stack, from the CLI)
        self.candidate = Candidate(**plan.candidate)
        # Asked between steps and while results come in: an interrupt Python dropped (one raised inside a
        # weakref callback is only printed) still stops the replay, which then stays resumable.
        self.stopped = stopped

    def _go_on(self) -> None:
        if self.stopped():
            raise KeyboardInterrupt

    def run(self, runs: list[Recorded], keep: bool = False) -> dict[str, Any]:
        """Send every run not yet replayed through the candidate's processes; returns the report."""
        plan, settings, candidate = self.plan, self.settings, self.candidate
        done = plan.results()
        pending = [r for r in runs if r.prompt["run_id"] not in done]
        started = time.monotonic()
        if pending:
            chats: dict[str, int] = {}
            for r in pending:
                at = minted_ms(r.prompt["run_id"])
                chats[r.prompt["chat_id"]] = max(chats.get(r.prompt["chat_id"], 0), at)
            cand.prepare(
                settings, plan.namespace, candidate, chats, {r.prompt["run_id"] for r in pending}
            )
            stack = self.launch(
                cand.processes(settings, plan.namespace, candidate, free_port_base())
            )
            try:
                stack.start()
                self._go_on()
                stack.wait_ready()
                self._go_on()
                started = time.monotonic()
                self._send(pending)
                self._collect({r.prompt["run_id"]: r for r in pending})
            finally:
                stack.stop()
        took = time.monotonic() - started
        results = list(plan.results().values())
        missing = sorted(set(plan.run_ids) - {r["run_id"] for r in results})
        if not missing and not keep:
            self.drop()
        return {
            "replay_id": plan.id,
            "namespace": plan.namespace,
            "through": candidate.through,
            "candidate": candidate.describe(),
            "policy_version": (candidate.policy or {}).get("version"),
            "runs": len(results),
            "changed": [r for r in results if r["changed"]],
            "summary": summary(results),
            "missing": missing,
            "runs_per_s": round(len(pending) / took, 2) if pending and took > 0 else None,
            "similarities": [r["similarity"] for r in results if "similarity" in r],
        }

    def _send(self, runs: list[Recorded]) -> None:
        """Write the prompts. Through moderation all at once; through the pipeline each user's runs one after
        another in their recorded order (the next when the last has ended), as the user sent them: sent at
        once they would meet the user's concurrency limit, which they never did live."""
        self._producer = Publisher(
            self.settings.kafka_bootstrap, "api", self.plan.namespace
        )  # as the edge would
        self._queues: dict[str, list[Recorded]] = {}
        for run in runs:
            self._queues.setdefault(
                run.prompt["user_id"] if self.candidate.through == "pipeline" else "", []
            ).append(run)
        for user in list(self._queues):
            self._next(user)

    def _next(self, user: str) -> None:
        """Send the user's next queued run (every queued run when through moderation)."""
        queue = self._queues.get(user) or []
        batch = queue if self.candidate.through == "moderation" else queue[:1]
        for run in batch:
            prompt = self.candidate.prompt(run.prompt)
            self._producer.publish(PROMPT_ACCEPTED, prompt, key=prompt["chat_id"])
        del queue[: len(batch)]
        if self._producer.flush(60):
            raise ReplayError("could not write the replayed prompts")

    def _collect(self, pending: dict[str, Recorded], quiet_s: float = 180.0) -> None:
        """Read what the replay's stages wrote until each pending run is decided (moderation) or ended
        (pipeline), or nothing came for quiet_s; each result is kept as it arrives."""
        pipeline = self.candidate.through == "pipeline"
        topics: list[Topic[Any]] = [PROMPT_MODERATED]
        if pipeline:
            topics += [*RUN_SCHEDULED.values(), RUN_COMPLETED, RUN_REJECTED]
        by_name = {named(t, self.plan.namespace): t for t in topics}
        consumer = Consumer(
            {
                **client_config(self.settings.kafka_bootstrap),
                "group.id": f"{self.plan.namespace}.collect",
            }
        )
        assign = []
        for name in by_name:
            parts = consumer.list_topics(name, timeout=10).topics[name].partitions
            assign += [TopicPartition(name, p, 0) for p in parts]
        consumer.assign(assign)
        now: dict[str, Recorded] = {}
        last = time.monotonic()
        try:
            with (
                self.plan.results_file.open("a") as out,
                tqdm(
                    total=len(pending), unit="run", desc="replaying", disable=not self.progress
                ) as bar,
            ):
                while pending and time.monotonic() - last < quiet_s:
                    self._go_on()
                    msg = consumer.poll(0.5)
                    if msg is None or msg.error():
                        continue
                    topic = by_name[str(msg.topic())]
                    try:
                        event = codec.decode(topic.schema, msg.value())
                    except PoisonEvent:
                        continue
                    run_id = str(run_of(event))
                    if run_id not in pending:
                        continue
                    replayed = now.setdefault(
                        run_id, Recorded(cast(PromptAccepted, event.get("prompt") or {}))
                    )
                    replayed.add(topic.schema, event)
                    if not settled(replayed, pipeline):
                        continue
                    run = pending.pop(run_id)
                    result = compared(run, replayed.moderated, replayed if pipeline else None)
                    if pipeline:
                        self._next(run.prompt["user_id"])
                    out.write(json.dumps(result, default=str) + "\n")
                    out.flush()
                    bar.update(1)
                    last = time.monotonic()
        finally:
            consumer.close()

    def drop(self) -> None:
        """The replay's topics and keyspace, once it is complete."""
        cand.drop(self.settings, self.plan.namespace, keyspace=self.candidate.through == "pipeline")


def settled(replayed: Recorded, pipeline: bool) -> bool:
    """Whether a replayed run has all it will be compared on (pure): its verdict and, through the pipeline, its
    end and, when it completed, its schedule. Each comes on its own topic, read interleaved, so the end can be
    read before either (the report then showed a refused run's verdict, or a completed run's pool, as gone: a
    false flip)."""
    if replayed.moderated is None:
        return False
    if not pipeline:
        return True
    return replayed.ended is not None and (
        replayed.completed is None or replayed.scheduled is not None
    )


def new_plan(
    settings: StackSettings, candidate: Candidate, selection: Selection, runs: list[Recorded]
) -> Plan:
    plan = Plan(
        id=uuid.uuid4().hex[:10],
        production=settings.namespace,
        candidate=asdict(candidate),
        selection=asdict(selection),
        run_ids=[r.prompt["run_id"] for r in runs],
    )
    plan.save()
    return plan


def recorded_again(window: Window, plan: Plan) -> list[Recorded]:
    """The plan's runs, read again from the log (a resumed replay keeps no copy of production events)."""
    return select(window, Selection(runs=tuple(plan.run_ids)))
