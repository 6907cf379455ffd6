"""`parley runs show RUN_ID`: one run's whole history across the topics, in order, with where each event sits.

A run id is a version-1 UUID minted when the edge accepts the turn, so it carries its own time. The inspector
reads the minute around that time of the prompt and scheduled-run topics to find the run and its partitions
(a chat's topics share partition numbers; its reply stream is on the partition the prompt names), then only
those partitions, from the run's start until it ended. Nothing is read from offset 0.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cassandra.query import ValueSequence

from runtime import tracing
from runtime.window import Read, Record, Window
from storage.at_rest import opened
from storage.ids import id_time_ms
from storage.session import connect_session
from topics.pipeline import (
    OUTPUT_MODERATED,
    PROMPT_ACCEPTED,
    PROMPT_MODERATED,
    RUN_COMPLETED,
    RUN_CONTROL,
    RUN_REJECTED,
    RUN_SCHEDULED,
    TOKEN_DELTA,
    Topic,
)

FIND_MS = 60_000  # how far around a run id's time its first event may be (clock skew between hosts)
GRACE_MS = 10_000  # after a run ends, what else of it may still arrive (output moderation, the stored answer)
LONGEST_RUN_MS = 3_600_000  # a run that has not ended is read this far past its start
ENDED_WITHIN_MS = 600_000  # when reading many runs at once, their ends are looked for this long after their window


class RunNotFound(LookupError):
    pass


def minted_ms(run_id: str) -> int:
    """When a run id was minted (epoch ms). Raises ValueError for anything but a version-1 UUID."""
    try:
        parsed = uuid.UUID(run_id)
    except ValueError as exc:
        raise ValueError(f"{run_id!r} is not a run id (a UUID)") from exc
    if parsed.version != 1:
        raise ValueError(f"{run_id!r} is not a run id: run ids are time-based (version 1) UUIDs")
    return id_time_ms(parsed)


def iso(ms: int | float) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def _ms(value: Any) -> int | None:
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(value) if isinstance(value, int | float) else None


def _prompt(event: Mapping[str, Any]) -> Mapping[str, Any]:
    return event["prompt"] if "prompt" in event else event


def run_of(event: Mapping[str, Any]) -> str | None:
    """The run an event is about: its own run_id, or its prompt's."""
    return event.get("run_id") or (event.get("prompt") or {}).get("run_id")


# Per record type, the fields the inspector shows (text only where it is the point: the question, the answer).
FIELDS: dict[str, tuple[str, ...]] = {
    "PromptAccepted": (
        "user_id",
        "tier",
        "chat_id",
        "message_id",
        "content",
        "max_tokens",
        "model",
        "temperature",
        "reply_partition",
        "store",
        "instructions",
        "parent_id",
        "branched",
        "memories",
    ),
    "PromptModerated": (
        "decision",
        "action",
        "category",
        "reason",
        "policy_version",
        "scores",
        "error",
        "check_ms",
    ),
    "RunScheduled": (
        "pool",
        "model",
        "priority",
        "estimate_tokens",
        "context_turns",
        "degraded_from",
        "rescheduled",
        "context",
        "messages",
    ),
    "RunRejected": ("code", "message", "category", "retry_after_s"),
    "OutputModerated": ("action", "category", "policy_version", "retracted_from", "error"),
    "RunCompleted": (
        "pool",
        "model",
        "finish_reason",
        "usage",
        "ttft_ms",
        "itl_p50_ms",
        "itl_p99_ms",
        "queue_ms",
        "duration_ms",
        "served_by",
        "moderation",
        "error_message",
        "content",
    ),
    "RunControl": ("action", "reason"),
    "TokenDelta": (
        "seq",
        "kind",
        "pool",
        "model",
        "estimated_wait_ms",
        "finish_reason",
        "error_code",
        "category",
    ),
}


def detail(record: Record) -> dict[str, Any]:
    """What a record says about the run, per type."""
    e, schema = record.event, record.topic.schema
    out = {k: e.get(k) for k in FIELDS.get(schema, ())}
    if schema == "PromptAccepted":
        out["messages"] = len(
            e.get("messages") or ()
        )  # the OpenAI route's conversation: its size here
    elif schema == "OutputModerated":
        peaks: dict[str, float] = {}
        for window in e["windows"]:
            for category, score in window["scores"].items():
                peaks[category] = max(peaks.get(category, 0.0), score)
        out |= {"windows": len(e["windows"]), "peak_scores": peaks}
    elif (
        schema == "TokenDelta"
    ):  # a run's calls to registered tools and their results: inference/tools.py
        out = {k: v for k, v in out.items() if v is not None}
        if calls := e.get("tool_calls"):
            out["tool_calls"] = json.loads(calls)
        if use := e.get("tool_result"):
            out["tool_result"] = dict(use)
    return out


def entry(record: Record) -> dict[str, Any]:
    return {
        "topic": record.topic.name,
        "partition": record.partition,
        "offset": record.offset,
        "type": record.topic.schema,
        "time": iso(record.timestamp_ms),
        "trace_id": tracing.trace_id(record.headers),  # "-": the record carried no trace context
        **detail(record),
    }


def coalesced(records: list[Record]) -> list[dict[str, Any]]:
    """Entries in log time order, a run's token deltas folded into one entry between its started and
    completed records: count, first and last time and offset, and the text they streamed."""
    out: list[dict[str, Any]] = []
    deltas: list[Record] = []
    for record in sorted(records, key=lambda r: (r.timestamp_ms, r.topic.name, r.offset)):
        e = record.event
        if (
            record.topic.schema == "TokenDelta"
            and e["kind"] == "delta"
            and not (e.get("tool_calls") or e.get("tool_result"))
        ):
            if not deltas:
                out.append({})  # its place in the order, filled below
            deltas.append(record)
            continue
        out.append(entry(record))
    if deltas:
        first, last = deltas[0], deltas[-1]
        folded = {
            "topic": first.topic.name,
            "partition": first.partition,
            "offset": first.offset,
            "type": "TokenDelta",
            "time": iso(first.timestamp_ms),
            "trace_id": tracing.trace_id(first.headers),
            "kind": "deltas",
            "count": len(deltas),
            "last_offset": last.offset,
            "last_time": iso(last.timestamp_ms),
            "text": "".join(d.event["text"] for d in deltas),
        }
        out[out.index({})] = folded
    return out


@dataclass
class History:
    run_id: str
    chat_id: str
    trace_id: str
    records: list[Record] = field(default_factory=list)
    stored: dict[str, Any] = field(default_factory=dict)  # what persistence and metering wrote

    @property
    def stored_ids(self) -> list[str]:
        """The message rows persistence writes for the run: its question (absent for a summary run, which has
        no prompt) and its answer (the run's own id)."""
        questions = [r.event["message_id"] for r in self.records if r.topic is PROMPT_ACCEPTED]
        return [*questions[:1], self.run_id]

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "chat_id": self.chat_id,
            "trace_id": self.trace_id,
            "events": coalesced(self.records),
            "stored": self.stored,
        }


def _chat_topics() -> list[Any]:
    return [PROMPT_MODERATED, RUN_COMPLETED, OUTPUT_MODERATED, RUN_CONTROL]


def find(window: Window, run_id: str) -> History:
    """The run's events from the log. Raises RunNotFound saying whether it is unknown or aged out."""
    run_id = str(uuid.UUID(run_id))
    at = minted_ms(run_id)
    first: Record | None = None
    opening: tuple[Topic[Any], ...] = (PROMPT_ACCEPTED, *RUN_SCHEDULED.values())
    starts = [Read(t, at - FIND_MS, at + FIND_MS) for t in opening]
    found = window.read(starts)
    try:
        for record in found:
            if run_of(record.event) == run_id:
                first = record
                if record.topic is PROMPT_ACCEPTED:
                    break
    finally:
        found.close()
    if first is None:
        oldest = window.oldest_ms(PROMPT_ACCEPTED)
        if oldest is not None and oldest > at + FIND_MS:
            raise RunNotFound(
                f"run {run_id} (from {iso(at)}) has aged out of retention: the log's oldest prompt is from "
                f"{iso(oldest)}"
            )
        raise RunNotFound(f"no run {run_id} in the log (it would be from {iso(at)})")
    prompt = _prompt(first.event)
    chat, reply = first.partition, prompt["reply_partition"]
    since = min(first.timestamp_ms, at) - 1_000
    reads = [
        Read(t, since, since + LONGEST_RUN_MS, (chat,)) for t in (PROMPT_ACCEPTED, *_chat_topics())
    ]
    # The scheduler may place a run on another partition of its pool's topic than its chat's (a consumer that
    # is down or full), so those are read whole over the window.
    reads += [Read(t, since, since + LONGEST_RUN_MS) for t in RUN_SCHEDULED.values()]
    reads += [Read(t, since, since + LONGEST_RUN_MS, (reply,)) for t in (TOKEN_DELTA, RUN_REJECTED)]
    ended: list[int] = []
    history = History(run_id, prompt["chat_id"], "-")
    for record in window.read(reads, until=lambda: ended[0] + GRACE_MS if ended else None):
        if run_of(record.event) != run_id:
            continue
        history.records.append(record)
        if record.topic is PROMPT_ACCEPTED or (
            history.trace_id == "-" and record.topic.schema == "RunScheduled"
        ):
            history.trace_id = tracing.trace_id(record.headers)
        if record.topic in (RUN_COMPLETED, RUN_REJECTED) and not ended:
            ended.append(record.timestamp_ms)
    return history


def stored(history: History, settings: Any, metering_url: str) -> dict[str, Any]:
    """What persistence stored (the chat's messages of this run: the question and the answer, with its rating)
    and what metering stored (the run's usage rows, read through the metering stage)."""
    import httpx

    out: dict[str, Any] = {}
    session = connect_session(settings.cassandra, timeout_s=20)
    try:
        rows = session.execute(
            f"SELECT message_id, role, content, run_id, model, pool, finish_reason, feedback, created_at "
            f"FROM {settings.keyspace_name}.messages WHERE chat_id = %s AND message_id IN %s",
            (uuid.UUID(history.chat_id), ValueSequence([uuid.UUID(m) for m in history.stored_ids])),
        )
        out["messages"] = [
            {
                **row._asdict(),
                "content": opened(row.content),  # sealed with its owner's key (storage/at_rest.py)
                "message_id": str(row.message_id),
                "created_at": iso(_ms(row.created_at) or 0),
            }
            for row in rows
        ]
    finally:
        session.cluster.shutdown()
    try:
        url = f"{metering_url}/usage-rows/{history.run_id}"
        response = httpx.get(url, headers=settings.internal_headers(), timeout=10)
        out["usage"] = (
            response.json()["data"]
            if response.status_code == 200
            else f"metering: {response.status_code}"
        )
    except httpx.HTTPError as exc:
        out["usage"] = f"metering unreachable: {exc}"
    return out
