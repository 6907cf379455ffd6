"""Server-sent events as a client of the chat API reads them: the eval runner's, the tests' and the benches' one
parser, for a blocking body (iter_sse) and an asyncio one (aiter_sse); `shown` folds a run's events into its answer.

Each event comes out as it completes (at its blank line) as {"event", "id", "data"}: data JSON-decoded, or
the text itself where it is not JSON (the OpenAI stream's closing `[DONE]`); comments (the pings) are skipped.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any

SseEvent = dict[str, Any]


class _Fold:
    """Lines in, events out: the one state machine both iterators share."""

    def __init__(self) -> None:
        self.current: SseEvent = {}

    def line(self, line: str) -> SseEvent | None:
        line = line.rstrip("\r\n")
        if not line:
            done, self.current = self.current, {}
            return done or None
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            try:
                self.current["data"] = json.loads(value)
            except ValueError:
                self.current["data"] = value
        elif field in ("event", "id"):
            self.current[field] = value
        return None

    def end(self) -> SseEvent | None:
        return self.current or None


def iter_sse(lines: Iterable[str]) -> Iterator[SseEvent]:
    fold = _Fold()
    for line in lines:
        if (event := fold.line(line)) is not None:
            yield event
    if (event := fold.end()) is not None:
        yield event


def shown(events: Iterable[SseEvent]) -> str:
    """A chat run's answer as its client shows it (web/src/run.js): the token deltas in stream order, cut where
    an output-moderation retraction says (`retract_from` counts code points, as a Python string does)."""
    text = ""
    for event in events:
        data = event.get("data") or {}
        if event.get("event") == "token":
            text += data.get("delta", "")
        elif event.get("event") == "moderation" and data.get("action") == "retract":
            text = text[: data.get("retract_from") or 0]
    return text


async def aiter_sse(lines: AsyncIterable[str]) -> AsyncIterator[SseEvent]:
    fold = _Fold()
    async for line in lines:
        if (event := fold.line(line)) is not None:
            yield event
    if (event := fold.end()) is not None:
        yield event
