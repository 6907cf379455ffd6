"""What a run already published before its consumer failed, folded from its reply partition's records.

A consumer that picks up a run which another consumer may have started (any record that was already in the
partition when it was assigned) reads the run's TokenDelta records from the log (runtime/reply_log.py). Generation then
continues after the published text, so the client's stream goes on with no duplicated text; a run that had
already ended only has its RunCompleted published again (the sinks are idempotent by run).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from topics.events import TokenDelta, ToolUse


@dataclass
class Prior:
    """A run's published progress (empty for a run nobody started)."""

    text: str = ""
    seq: int = -1  # the last record's seq; -1 when nothing was published
    tokens: int = 0  # completion tokens behind `text`
    terminal: TokenDelta | None = None  # the completed/error record, when the run had ended
    # a run calling registered tools (inference/tools.py): each step's calls and results as prompt messages,
    # the results, and the text since the last of them (what generation continues)
    steps: list[dict[str, Any]] = field(default_factory=list)
    uses: list[ToolUse] = field(default_factory=list)
    tail: str = ""

    @property
    def started(self) -> bool:
        return self.seq >= 0


def prior_of(records: list[TokenDelta]) -> Prior:
    """Fold a run's records (any order, possibly repeated) into its progress (pure)."""
    prior = Prior()
    seen: set[int] = set()
    for record in sorted(records, key=lambda r: r["seq"]):
        if record["seq"] in seen:
            continue
        seen.add(record["seq"])
        prior.seq = record["seq"]
        if record["kind"] == "delta":
            prior.text += record["text"]
            prior.tail += record["text"]
        if record["kind"] == "delta" and (calls := record.get("tool_calls")):
            said = {"role": "assistant", "content": prior.tail, "tool_calls": json.loads(calls)}
            prior.steps.append(said)
            prior.tail = ""
        if record["kind"] == "delta" and (use := record.get("tool_result")):
            prior.steps.append(
                {"role": "tool", "tool_call_id": use["call_id"], "content": use["content"]}
            )
            prior.uses.append(use)
        if (tokens := record.get("tokens")) is not None:
            prior.tokens = tokens
        if record["kind"] in ("completed", "error") and prior.terminal is None:
            prior.terminal = record
    return prior
