"""Server-sent events as a client of the chat API reads them: the eval runner's, the tests' and the benches'."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator


def iter_sse(lines: Iterable[str]) -> Iterator[dict]:  # type: ignore[type-arg]
    """Each event of an SSE body as it completes: {"event", "id", "data"} (data JSON-decoded)."""
    current: dict = {}  # type: ignore[type-arg]
    for line in lines:
        if not line:
            if current:
                yield current
                current = {}
            continue
        if line.startswith(":"):  # a comment (the ping)
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            current["data"] = json.loads(value)
        elif field in ("event", "id"):
            current[field] = value
    if current:
        yield current
