"""Reading the local collector's spans file: one run's trace as a tree (`parley trace RUN_ID`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def spans(path: Path) -> Iterator[dict[str, Any]]:
    """Every span in an OTLP JSON file (one export batch a line), with its service name and attributes flat."""
    if not path.exists():
        return
    with path.open() as lines:
        for line in lines:
            for resource in json.loads(line).get("resourceSpans", []):
                service = _flat(resource.get("resource", {}).get("attributes", [])).get(
                    "service.name", "?"
                )
                for scope in resource.get("scopeSpans", []):
                    for span in scope.get("spans", []):
                        yield {
                            **span,
                            "service": service,
                            "attrs": _flat(span.get("attributes", [])),
                        }


def _flat(attributes: list[dict[str, Any]]) -> dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values()), None) for a in attributes}


def run_trace(path: Path, run_id: str) -> list[dict[str, Any]]:
    """Every span of the trace(s) holding a span of this run (the edge and the inference consumer mark it)."""
    every = list(spans(path))
    traces = {s["traceId"] for s in every if s["attrs"].get("parley.run_id") == run_id}
    return [s for s in every if s["traceId"] in traces]


def tree(found: list[dict[str, Any]]) -> list[str]:
    """One line a span, children under their parent, in start order: offset from the trace's start, duration,
    service and name."""
    if not found:
        return []
    start = min(int(s["startTimeUnixNano"]) for s in found)
    ids = {s["spanId"] for s in found}
    children: dict[str, list[dict[str, Any]]] = {}
    for span in sorted(found, key=lambda s: int(s["startTimeUnixNano"])):
        parent = span.get("parentSpanId") if span.get("parentSpanId") in ids else ""
        children.setdefault(parent or "", []).append(span)
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for span in children.get(parent, []):
            begin = (int(span["startTimeUnixNano"]) - start) / 1e6
            took = (int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])) / 1e6
            lines.append(
                f"{begin:9.1f} ms {took:9.1f} ms  {'  ' * depth}{span['service']}: {span['name']}"
            )
            walk(span["spanId"], depth + 1)

    walk("", 0)
    return lines
