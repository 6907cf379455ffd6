"""Runs a consumer has read and that wait for an engine slot: which one starts next (pure).

The highest priority first (enterprise, pro, free), aged: every `aging_s` seconds a run has waited counts as
one more level, so a waiting free run is served eventually however busy the higher tiers keep the engine.
A tier whose slot share is below 1 starts a run only while it holds fewer than its share of the slots, so
the rest stay free for the tiers above it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class Waiting(Generic[T]):
    item: T
    tier: str
    priority: int
    since: float
    order: int


class RunQueue(Generic[T]):
    def __init__(self, aging_s: float) -> None:
        self.aging_s = aging_s
        self._waiting: list[Waiting[T]] = []
        self._order = 0

    def __len__(self) -> int:
        return len(self._waiting)

    def push(self, item: T, tier: str, priority: int, now: float) -> None:
        self._order += 1
        self._waiting.append(Waiting(item, tier, priority, now, self._order))

    def score(self, waiting: Waiting[T], now: float) -> float:
        return waiting.priority + (now - waiting.since) / self.aging_s

    def pop(
        self,
        now: float,
        may_start: Callable[[str], bool],
        eligible: Callable[[T], bool] | None = None,
    ) -> T | None:
        """The best waiting run whose tier may take a slot now and that is `eligible` (highest aged priority,
        then first come)."""
        best: Waiting[T] | None = None
        for w in self._waiting:
            if not may_start(w.tier) or (eligible is not None and not eligible(w.item)):
                continue
            if best is None or (self.score(w, now), -w.order) > (
                self.score(best, now),
                -best.order,
            ):
                best = w
        if best is None:
            return None
        self._waiting.remove(best)
        return best.item

    def remove(self, drop: Callable[[T], bool]) -> list[T]:
        gone = [w.item for w in self._waiting if drop(w.item)]
        self._waiting = [w for w in self._waiting if not drop(w.item)]
        return gone

    def by_tier(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for w in self._waiting:
            counts[w.tier] = counts.get(w.tier, 0) + 1
        return counts
