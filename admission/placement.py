"""Bounded queues and graceful degradation: how long would a run wait, on which engine, and where it should go
(pure, except PoolView, which follows the consumers' status topic). Shared by the scheduler, which decides,
and the edge, which sheds at the door what the scheduler could only refuse (`at_the_door`).

Each inference consumer publishes its engine's load every quarter second: slots, runs in the engine and runs
waiting, by tier, its mean run time, and the partitions of the pool's topic it reads. A run's wait on an
engine is estimated from the runs that hold, or are ahead of it for, the slots its tier may use there.

A run goes to its chat's home partition (the engine holding the chat's prompt prefix warm) while that engine
can start it within its tier's bound, else to a partition of the pool's engine with the shortest wait when
that one can (a cold prefix costs less than the wait), else, for tiers that may degrade, to a smaller pool
that holds it, else it is rejected at once with 429 and a Retry-After: an admitted run's wait is bounded.
Judging engine by engine matters: a pool with a free slot on one engine does not help a run queued on another.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import cast

from confluent_kafka import OFFSET_END, Consumer, TopicPartition

from admission.limits import Limits, tier_cap
from runtime.kafka import ConsumerThread, consumer_config, until_ready
from runtime.settings import Pool
from runtime.tables import TopicTable
from topics import codec
from topics.clock import now_ms
from topics.errors import PoisonEvent
from topics.events import PoolStatus
from topics.pipeline import POOL_STATUS, RUN_SCHEDULED, check_consume, named

STALE_MS = 3_000  # a consumer silent this long is not counted (it died, or left its group)
TRANSIT_MS = 250  # a run placed this long before a consumer's status may not have reached it yet
DEFAULT_RUN_S = 5.0


@dataclass
class EngineLoad:
    """One inference consumer's engine, from its latest status."""

    slots: int
    partitions: tuple[int, ...] = ()  # of its pool's scheduled-runs topic
    running: dict[str, int] = field(default_factory=dict)
    queued: dict[str, int] = field(default_factory=dict)
    mean_run_s: float = DEFAULT_RUN_S
    at: int = 0  # when the status was taken (ms)

    def capacity(self, share: float) -> int:
        return tier_cap(self.slots, share)


def pool_loads(statuses: Iterable[PoolStatus], now_ms: int) -> dict[str, list[EngineLoad]]:
    """Each pool's live engines from their healthy consumers' latest statuses (pure)."""
    loads: dict[str, list[EngineLoad]] = {}
    for status in statuses:
        at = int(status["at"])
        if now_ms - at > STALE_MS or not status["healthy"]:
            continue
        loads.setdefault(status["pool"], []).append(
            EngineLoad(
                slots=status["slots"],
                partitions=tuple(status.get("partitions") or ()),
                running=dict(status["running"]),
                queued=dict(status["queued"]),
                mean_run_s=status["mean_run_s"],
                at=at,
            )
        )
    return loads


def estimated_wait(load: EngineLoad, tier: str, tiers: dict[str, Limits]) -> float:
    """Seconds a new run of `tier` would wait for a slot on this engine (pure).

    Ahead of it: waiting runs of its priority or higher. Free for it: the engine's free slots, but no more than
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


def home_partition(chat_id: str, partitions: int) -> int:
    """The partition of a chat's runs in a pool while its engine has room (stable across processes), of the
    pool topic's `partitions`."""
    return zlib.crc32(chat_id.encode()) % partitions


@dataclass(frozen=True)
class Placement:
    pool: str | None  # None: over capacity everywhere it may go
    wait_s: float
    partition: int | None = None  # of the pool's scheduled-runs topic
    degraded_from: str | None = None
    retry_after_s: int | None = None


def soonest(
    engines: list[EngineLoad], tier: str, tiers: dict[str, Limits]
) -> tuple[float, EngineLoad] | None:
    """The pool's engine that could start a run of `tier` soonest, and its wait (None: no engine reports)."""
    waits = [(estimated_wait(e, tier, tiers), e) for e in engines if e.partitions]
    return min(waits, key=lambda w: w[0]) if waits else None


def route(
    pool: str,
    engines: list[EngineLoad],
    chat_id: str,
    tier: str,
    tiers: dict[str, Limits],
    partitions: int,
) -> Placement:
    """The partition a run goes to in a pool, and its wait there (pure): home while its engine is within the
    tier's bound, else a partition of the engine with the shortest wait. No engine reporting: not judged."""
    home = home_partition(chat_id, partitions)
    owner = next((e for e in engines if home in e.partitions), None)
    home_wait = estimated_wait(owner, tier, tiers) if owner is not None else math.inf
    if home_wait <= tiers[tier].max_queue_wait_s:
        return Placement(pool, home_wait, home)
    best_engine = soonest(engines, tier, tiers)
    if best_engine is None:
        return Placement(pool, 0.0, home)
    wait, best = best_engine
    if wait >= home_wait:
        return Placement(pool, home_wait, home)
    return Placement(pool, wait, best.partitions[home % len(best.partitions)])


def place(
    wanted: str,
    smaller: list[str],
    loads: dict[str, list[EngineLoad]],
    chat_id: str,
    tier: str,
    tiers: dict[str, Limits],
    partitions: dict[str, int],
) -> Placement:
    """The pool and partition a run goes to (pure): the pool chosen for it while one of its engines can start
    it within its tier's bound; under pressure, a smaller pool that holds it (tiers that may degrade);
    otherwise none, with when to retry. A pool with no live status (consumers starting) is not judged: the run
    goes to its home partition there and waits in Kafka."""
    limits = tiers[tier]
    first = route(wanted, loads.get(wanted, []), chat_id, tier, tiers, partitions[wanted])
    if first.wait_s <= limits.max_queue_wait_s:
        return first
    best = first.wait_s
    if limits.degrade:
        for pool in smaller:
            if pool not in loads:
                continue
            other = route(pool, loads[pool], chat_id, tier, tiers, partitions[pool])
            if other.wait_s <= limits.max_queue_wait_s:
                return Placement(pool, other.wait_s, other.partition, degraded_from=wanted)
            best = min(best, other.wait_s)
    return over_capacity(best, limits)


def capacity_message(model: str, wait_s: float) -> str:
    return (
        f"The {model} model is at capacity (about {int(wait_s)}s of queue). Please retry shortly."
    )


def over_capacity(wait_s: float, limits: Limits) -> Placement:
    return Placement(
        None, wait_s, retry_after_s=max(1, math.ceil(wait_s - limits.max_queue_wait_s))
    )


def wanted_pool(model: str | None, pools: dict[str, Pool], default_pool: str) -> str:
    """The pool a request asks for: the smallest serving its model, else the default pool (pure)."""
    return next(
        (n for n, p in sorted(pools.items(), key=lambda i: i[1].context) if p.model == model),
        default_pool,
    )


def at_the_door(
    model: str | None,
    least_tokens: int,
    may_grow: bool,
    pools: dict[str, Pool],
    default_pool: str,
    loads: dict[str, list[EngineLoad]],
    tier: str,
    tiers: dict[str, Limits],
) -> Placement | None:
    """The edge's early check, before a request enters the pipeline (pure): over capacity (a Placement with no
    pool) when no pool the scheduler could place this run in has room for its tier now, else None (the
    scheduler decides). Under a burst it answers the 429 in a millisecond, without the Kafka hops and ledger
    read a refusal by the scheduler costs, so the engines keep the CPU (on a small box) and the brokers.

    It never sheds what the scheduler would admit from the same statuses: the candidates are every pool the
    run could end up in. `least_tokens` is a lower bound of the scheduler's estimate (the new message and
    max_tokens; the scheduler adds the system prompt and history), and `may_grow` says the history may push
    the run to a larger pool than the one asked for.
    """
    limits = tiers[tier]
    wanted = wanted_pool(model, pools, default_pool)
    size = pools[wanted].context
    candidates = [
        name
        for name, pool in pools.items()
        if least_tokens <= pool.context
        and (
            name == wanted
            or (pool.context > size and (may_grow or least_tokens > size))
            or (pool.context < size and limits.degrade)
        )
    ]
    waits = []
    for name in candidates:
        best = soonest(loads.get(name, []), tier, tiers)
        if best is None or best[0] <= limits.max_queue_wait_s:
            return None  # room somewhere, or no live status (not judged)
        waits.append(best[0])
    return (
        over_capacity(min(waits), limits) if waits else None
    )  # nothing holds it: the scheduler says why


def count_undecided(
    loads: dict[str, list[EngineLoad]], undecided: Iterable[tuple[str, str]]
) -> None:
    """Count each run let through the door and not decided yet, (pool, tier), as waiting on its pool's least
    busy engine, where the scheduler would most likely put it (in place, on `loads`)."""
    for pool, tier in undecided:
        if loads.get(pool):
            least = min(
                loads[pool],
                key=lambda e: sum(e.queued.values()) + sum(e.running.values()) - e.slots,
            )
            least.queued[tier] = least.queued.get(tier, 0) + 1


class PoolView(TopicTable):
    """The consumers' latest statuses, plus the runs placed since that no status shows yet: by this replica
    (at once) and by every other scheduler replica (read from the scheduled-runs topics, tens of milliseconds
    later). Without the others' placements, two schedulers that see the same free slot both fill it, and one
    run waits a whole slot turnover: the overshoot that kept admitted runs waiting seconds under a burst."""

    def __init__(self, bootstrap: str, namespace: str, reader: str) -> None:
        super().__init__(bootstrap, POOL_STATUS, namespace, reader, since_s=STALE_MS / 1000)
        for topic in RUN_SCHEDULED.values():
            check_consume(reader, topic, tailing=True)
        self._placed: dict[
            str, tuple[int, str, str, int | None]
        ] = {}  # run id -> (at ms, pool, tier, partition)
        # Runs this replica's door let through whose admission is not decided yet: run id -> (at ms, pool, tier).
        # A burst arrives faster than any status or placement can show it; counted here, the door sheds what
        # the scheduler would only refuse seconds later, behind every prompt let in before it.
        self._undecided: dict[str, tuple[int, str, str]] = {}
        self._topics = {named(RUN_SCHEDULED[pool], namespace): pool for pool in RUN_SCHEDULED}
        self._runs = Consumer(
            consumer_config(
                bootstrap, f"{namespace or 'parley'}.placements", **{"enable.partition.eof": False}
            )
        )
        self._follower = ConsumerThread(self._runs, "placements", self._follow)
        self.partitions: dict[
            str, int
        ] = {}  # pool -> partitions of its scheduled-runs topic, read at start

    def start(self, timeout_s: float = 30.0) -> None:
        super().start(timeout_s)
        assignment = []
        for topic in self._topics:
            metadata = until_ready(
                f"placements {topic}", partial(self._runs.list_topics, topic, timeout=10)
            )
            assignment += [
                TopicPartition(topic, p, OFFSET_END) for p in metadata.topics[topic].partitions
            ]
            self.partitions[self._topics[topic]] = len(metadata.topics[topic].partitions)
        self._follower.start(assignment)

    def _follow(self) -> None:
        msg = self._runs.poll(0.1)
        if msg is None or msg.error() is not None or not msg.value():
            return
        pool = self._topics[msg.topic() or ""]
        try:
            run = codec.decode(RUN_SCHEDULED[pool].schema, msg.value())
        except PoisonEvent:
            return  # the inference consumer dead-letters it
        prompt = run["prompt"]
        self._placed.setdefault(
            prompt["run_id"], (msg.timestamp()[1], pool, prompt["tier"], msg.partition())
        )
        if (
            len(self._placed) > 1_000
        ):  # a replica that places nothing and serves no chat still forgets
            self._forget_before(now_ms() - STALE_MS)

    def _forget_before(self, ms: int) -> None:
        for run_id, placed in list(self._placed.items()):
            if placed[0] < ms:
                self._placed.pop(run_id, None)  # every live status is newer

    def stop(self) -> None:
        self._follower.stop()
        super().stop()

    def admitted(self, run_id: str, pool: str, tier: str, partition: int | None) -> None:
        self._placed[run_id] = (now_ms(), pool, tier, partition)

    def pending(self, run_id: str, pool: str, tier: str) -> None:
        """The door let a run of `tier` through to `pool`: it counts as waiting there until `decided`."""
        self._undecided[run_id] = (now_ms(), pool, tier)

    def decided(self, run_id: str) -> None:
        self._undecided.pop(run_id, None)

    def loads(self) -> dict[str, list[EngineLoad]]:
        now = now_ms()
        loads = pool_loads(cast(Iterable[PoolStatus], self.rows().values()), now)
        self._forget_before(now - STALE_MS)
        for at, pool, tier, partition in list(self._placed.values()):
            for engine in loads.get(pool, []):
                if (
                    partition in engine.partitions and at >= engine.at - TRANSIT_MS
                ):  # not in its status yet
                    engine.queued[tier] = engine.queued.get(tier, 0) + 1
        for run_id, (at, _pool, _tier) in list(self._undecided.items()):
            if at < now - STALE_MS:
                self._undecided.pop(run_id, None)  # its decision never came back here
        count_undecided(
            loads,
            [(p, t) for r, (_, p, t) in list(self._undecided.items()) if r not in self._placed],
        )
        return loads
