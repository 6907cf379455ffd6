"""The benches' one percentile: nearest rank, q in percent (50, 95, 99), None for no values; a sample's summary;
and the time one awaited piece of work takes."""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Sequence
from typing import Any


def pct(values: Sequence[float], q: float, digits: int | None = None) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    value = ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]
    return round(value, digits) if digits is not None else value


def summary(values: Sequence[float]) -> dict[str, float | None]:
    """p50/p95/p99, mean and count of a sample, in its own unit rounded to 0.01."""
    return {
        "p50": pct(values, 50, 2),
        "p95": pct(values, 95, 2),
        "p99": pct(values, 99, 2),
        "mean": round(statistics.fmean(values), 2) if values else None,
        "n": len(values),
    }


async def timed(work: Awaitable[Any]) -> float:
    """Milliseconds until `work` is done."""
    started = time.perf_counter()
    await work
    return (time.perf_counter() - started) * 1000
