"""Which recorded runs a replay sends again: the filters (a time window, runs, a chat, a user, how they ended,
their rating) read over the window of the log they name, never from offset 0, and each run as production
recorded it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from runtime.window import Read, Window
from storage.history import ENDED_WITHIN_MS, FIND_MS, GRACE_MS, minted_ms, run_of
from topics.clock import now_ms
from topics.events import PromptAccepted
from topics.pipeline import (
    FEEDBACK,
    PROMPT_ACCEPTED,
    PROMPT_MODERATED,
    RUN_COMPLETED,
    RUN_REJECTED,
    RUN_SCHEDULED,
)


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

    prompt: PromptAccepted
    moderated: Mapping[str, Any] | None = None
    ended: str | None = None
    rating: str | None = None
    scheduled: Mapping[str, Any] | None = None
    completed: Mapping[str, Any] | None = None

    def add(self, schema: str, event: Mapping[str, Any]) -> None:
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
        Read(FEEDBACK, since, now_ms()),
    ]
    runs: dict[str, Recorded] = {}
    later: list[tuple[str, Mapping[str, Any]]] = []
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
            runs[event["run_id"]] = Recorded(cast(PromptAccepted, event))
        else:
            later.append((schema, event))
    for (
        schema,
        event,
    ) in later:  # a chat's events are in order per partition; topics are read interleaved
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
