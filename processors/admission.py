"""Bounded queues and graceful degradation: how long would a run wait in a pool, and where it should go (pure,
except PoolView, which follows the consumers' status topic).

Each inference consumer publishes its load every half second (slots, runs in the engine and runs waiting, by
tier, and its mean run time). A run's wait is estimated from the runs that hold, or are ahead of it for, the
slots its tier may use. A run whose wait exceeds its tier's bound goes to a smaller pool that holds it when
its tier may degrade, else it is rejected at once with 429 and a Retry-After: an admitted run's wait is bounded.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from topics.codec import Event
from topics.limits import Limits
from topics.pipeline import POOL_STATUS
from topics.tables import TopicTable

STALE_MS = 3_000  # a consumer silent this long is not counted (it died, or left its group)
DEFAULT_RUN_S = 5.0


@dataclass
class PoolLoad:
    worker_slots: list[int] = field(default_factory=list)  # each live consumer's slots
    running: dict[str, int] = field(default_factory=dict)
    queued: dict[str, int] = field(default_factory=dict)
    mean_run_s: float = DEFAULT_RUN_S
    oldest_at: int = 0  # the least recent status counted (ms)

    @property
    def slots(self) -> int:
        return sum(self.worker_slots)

    def capacity(self, share: float) -> int:
        return sum(max(1, math.floor(s * share)) for s in self.worker_slots)


def pool_loads(statuses: Iterable[Event], now_ms: int) -> dict[str, PoolLoad]:
    """The live load of each pool from its healthy consumers' latest statuses (pure)."""
    loads: dict[str, PoolLoad] = {}
    for status in statuses:
        at = _ms(status["at"])
        if now_ms - at > STALE_MS or not status["healthy"]:
            continue
        load = loads.setdefault(status["pool"], PoolLoad(mean_run_s=0.0, oldest_at=at))
        load.worker_slots.append(status["slots"])
        for tier, n in status["running"].items():
            load.running[tier] = load.running.get(tier, 0) + n
        for tier, n in status["queued"].items():
            load.queued[tier] = load.queued.get(tier, 0) + n
        load.mean_run_s += status["mean_run_s"] * status["slots"]  # weighted by slots
        load.oldest_at = min(load.oldest_at, at)
    for load in loads.values():
        load.mean_run_s = load.mean_run_s / load.slots if load.slots else DEFAULT_RUN_S
    return loads


def estimated_wait(load: PoolLoad, tier: str, tiers: dict[str, Limits]) -> float:
    """Seconds a new run of `tier` would wait for a slot in this pool (pure).

    Ahead of it: waiting runs of its priority or higher. Free for it: the pool's free slots, but no more than
    what its tier's slot share leaves (a tier held to half the slots waits once it holds half).
    """
    mine = tiers[tier]
    capacity = load.capacity(mine.slot_share)
    free = min(capacity - load.running.get(tier, 0), load.slots - sum(load.running.values()))
    ahead = sum(n for t, n in load.queued.items() if tiers.get(t, mine).priority >= mine.priority)
    behind_me = ahead + 1 - max(0, free)
    if behind_me <= 0:
        return 0.0
    return behind_me * load.mean_run_s / max(1, capacity)


@dataclass(frozen=True)
class Placement:
    pool: str | None  # None: over capacity everywhere it may go
    wait_s: float
    degraded_from: str | None = None
    retry_after_s: int | None = None


def place(
    wanted: str,
    smaller: list[str],
    loads: dict[str, PoolLoad],
    tier: str,
    tiers: dict[str, Limits],
) -> Placement:
    """The pool a run goes to (pure): the one chosen for it while its wait is within its tier's bound; under
    pressure, a smaller pool that holds it (tiers that may degrade); otherwise none, with when to retry.
    A pool with no live status (consumers starting) is not judged: the run goes there and waits in Kafka."""
    limits = tiers[tier]
    if wanted not in loads:
        return Placement(wanted, 0.0)
    wait = estimated_wait(loads[wanted], tier, tiers)
    if wait <= limits.max_queue_wait_s:
        return Placement(wanted, wait)
    best = wait
    if limits.degrade:
        for pool in smaller:
            if pool not in loads:
                continue
            other = estimated_wait(loads[pool], tier, tiers)
            if other <= limits.max_queue_wait_s:
                return Placement(pool, other, degraded_from=wanted)
            best = min(best, other)
    return Placement(None, best, retry_after_s=max(1, math.ceil(best - limits.max_queue_wait_s)))


def _ms(value: object) -> int:
    return int(value.timestamp() * 1000) if hasattr(value, "timestamp") else int(value)  # type: ignore[call-overload]


class PoolView(TopicTable):
    """The consumers' latest statuses, plus the runs this replica admitted since (not in any status yet)."""

    def __init__(self, bootstrap: str, namespace: str) -> None:
        super().__init__(bootstrap, POOL_STATUS, namespace, since_s=STALE_MS / 1000)
        self._sent: dict[str, deque[tuple[int, str]]] = {}

    def admitted(self, pool: str, tier: str) -> None:
        self._sent.setdefault(pool, deque()).append((int(time.time() * 1000), tier))

    def loads(self) -> dict[str, PoolLoad]:
        now = int(time.time() * 1000)
        loads = pool_loads(self.rows().values(), now)
        for pool, sent in self._sent.items():
            load = loads.get(pool)
            while sent and (load is None or sent[0][0] < load.oldest_at - 250):
                sent.popleft()  # every consumer's status is newer: the run is counted there
            if load is not None:
                for _, tier in sent:
                    load.queued[tier] = load.queued.get(tier, 0) + 1
        return loads
