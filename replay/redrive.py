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

import difflib
import json
import socket
import statistics
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from tqdm import tqdm

from replay import candidate as cand
from replay.candidate import Candidate
from replay.runs import ENDED_WITHIN_MS, FIND_MS, GRACE_MS, minted_ms, run_of
from topics import codec
from topics.errors import PoisonEvent
from topics.kafka import Publisher
from topics.pipeline import (
    FEEDBACK,
    PROMPT_ACCEPTED,
    PROMPT_MODERATED,
    RUN_COMPLETED,
    RUN_REJECTED,
    RUN_SCHEDULED,
    Topic,
    named,
)
from topics.settings import StackSettings, state_dir
from topics.window import Read, Window


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
    scheduled: dict[str, Any] | None = None
    completed: dict[str, Any] | None = None

    def add(self, schema: str, event: dict[str, Any]) -> None:
        """Take in one of the run's later events (its verdict, schedule, completion or rejection)."""
        if schema == "PromptModerated":
            self.moderated = event
        elif schema == "RunScheduled":
            self.scheduled = event
        elif schema == "RunCompleted":
            self.completed, self.ended = event, f"completed:{event['finish_reason']}"
        elif schema == "RunRejected":
            self.ended = f"rejected:{event['code']}"

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


def select(window: Window, selection: Selection) -> list[Recorded]:
    """The recorded runs the filters match, in the order they were accepted."""
    since, until = selection.window()
    reads = [
        Read(PROMPT_ACCEPTED, since, until),
        Read(PROMPT_MODERATED, since, until + GRACE_MS),
        *(Read(t, since, until + ENDED_WITHIN_MS) for t in RUN_SCHEDULED.values()),
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
        run = runs.get(event["message_id"] if schema == "Feedback" else str(run_of(event)))
        if run is None:
            continue
        if schema == "Feedback":
            run.rating = event["rating"] if event["rating"] != "none" else None
        else:
            run.add(schema, event)
    chosen = [
        r
        for r in runs.values()
        if (not selection.outcome or selection.outcome in r.outcomes())
        and (not selection.feedback or r.rating == selection.feedback)
    ]
    return chosen[: selection.limit] if selection.limit else chosen


def verdict(moderated: dict[str, Any] | None) -> dict[str, Any]:
    if moderated is None:
        return {"decision": None, "action": None, "category": None, "policy_version": None}
    keys = ("decision", "action", "category", "policy_version")
    return {k: moderated.get(k) for k in keys} | {"scores": moderated.get("scores") or {}}


def served(scheduled: dict[str, Any] | None, done: dict[str, Any] | None, ended: str | None) -> dict[str, Any]:
    """What a run's answer was (pure): pool, prompt tokens, the answer, its tokens, TTFT, how it ended."""
    context = (scheduled or {}).get("context") or {}
    usage = (done or {}).get("usage") or {}
    return {
        "pool": (scheduled or {}).get("pool"),
        "model": (done or scheduled or {}).get("model"),
        "prompt_tokens": context.get("prompt_tokens", usage.get("prompt_tokens")),
        "completion_tokens": usage.get("completion_tokens"),
        "ttft_ms": (done or {}).get("ttft_ms"),
        "ended": ended,
        "answer": (done or {}).get("content"),
    }


COMPARED = ("pool", "prompt_tokens", "completion_tokens", "ended")


def compared(run: Recorded, now: dict[str, Any] | None, replayed: Recorded | None = None) -> dict[str, Any]:
    """One run's result (pure): the verdict then and now and, when the run went through the whole pipeline
    (`replayed`), what it was served then and now; `changed` names every field that differs."""
    then, new = verdict(run.moderated), verdict(now)
    what = [k for k in ("decision", "action") if then[k] != new[k]]
    out = {
        "run_id": run.prompt["run_id"],
        "chat_id": run.prompt["chat_id"],
        "user_id": run.prompt["user_id"],
        "content": run.prompt["content"][:200],
        "then": then,
        "now": new,
    }
    if replayed is not None:
        was = served(run.scheduled, run.completed, run.ended)
        now_served = served(replayed.scheduled, replayed.completed, replayed.ended)
        out["then"] |= was
        out["now"] |= now_served
        what += [k for k in COMPARED if was[k] != now_served[k]]
        a, b = was["answer"] or "", now_served["answer"] or ""
        out["similarity"] = round(difflib.SequenceMatcher(None, a, b).ratio(), 3) if a or b else 1.0
    out["changed"] = bool(what)
    out["what"] = what
    return out


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts then and now per action, and each kind of flip (pure)."""
    then = Counter(r["then"]["action"] or "none" for r in results)
    now = Counter(r["now"]["action"] or "none" for r in results)

    def said(v: dict[str, Any]) -> str:
        return f"{v['decision']}/{v['action'] or 'none'}"

    moderated = [r for r in results if {"decision", "action"} & set(r.get("what", ()))]
    flips = Counter(f"{said(r['then'])} -> {said(r['now'])}" for r in moderated)
    served: dict[str, Any] = {}
    sims = [r["similarity"] for r in results if "similarity" in r]
    if sims:

        def total(when: str, key: str) -> int:
            return sum(r[when].get(key) or 0 for r in results)

        def median(when: str, key: str) -> float | None:
            found = [r[when][key] for r in results if r[when].get(key)]
            return round(statistics.median(found), 1) if found else None

        served = {
            "fields_changed": dict(Counter(w for r in results for w in r["what"])),
            "answer_similarity_mean": round(sum(sims) / len(sims), 3),
            "completion_tokens": {"then": total("then", "completion_tokens"), "now": total("now", "completion_tokens")},
            "prompt_tokens": {"then": total("then", "prompt_tokens"), "now": total("now", "prompt_tokens")},
            "ttft_ms_median": {"then": median("then", "ttft_ms"), "now": median("now", "ttft_ms")},
            "pools": {
                "then": dict(Counter(r["then"].get("pool") for r in results)),
                "now": dict(Counter(r["now"].get("pool") for r in results)),
            },
        }
    return {
        **served,
        "then": dict(then),
        "now": dict(now),
        "changed": sum(r["changed"] for r in results),
        "moderation_changed": len(moderated),
        "flips": dict(flips),
        "newly_blocked": sum(r["now"]["decision"] == "blocked" for r in moderated),
        "newly_allowed": sum(r["now"]["decision"] == "allowed" for r in moderated),
    }


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
    def __init__(self, plan: Plan, settings: StackSettings, progress: bool = True) -> None:
        self.plan, self.settings, self.progress = plan, settings, progress
        self.candidate = Candidate(**plan.candidate)

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
            cand.prepare(settings, plan.namespace, candidate, chats, {r.prompt["run_id"] for r in pending})
            stack = cand.processes(settings, plan.namespace, candidate, free_port_base())
            try:
                stack.start()
                stack.wait_ready()
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
        self._producer = Publisher(self.settings.kafka_bootstrap, "api", self.plan.namespace)  # as the edge would
        self._queues: dict[str, list[Recorded]] = {}
        for run in runs:
            self._queues.setdefault(run.prompt["user_id"] if self.candidate.through == "pipeline" else "", []).append(
                run
            )
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
        topics: list[Topic] = [PROMPT_MODERATED]
        if pipeline:
            topics += [*RUN_SCHEDULED.values(), RUN_COMPLETED, RUN_REJECTED]
        by_name = {named(t, self.plan.namespace): t for t in topics}
        consumer = Consumer(
            {"bootstrap.servers": self.settings.kafka_bootstrap, "group.id": f"{self.plan.namespace}.collect"}
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
                tqdm(total=len(pending), unit="run", desc="replaying", disable=not self.progress) as bar,
            ):
                while pending and time.monotonic() - last < quiet_s:
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
                    replayed = now.setdefault(run_id, Recorded(event.get("prompt") or {}))
                    replayed.add(topic.schema, event)
                    waiting = replayed.ended is None if pipeline else replayed.moderated is None
                    if waiting:
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


def new_plan(settings: StackSettings, candidate: Candidate, selection: Selection, runs: list[Recorded]) -> Plan:
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
