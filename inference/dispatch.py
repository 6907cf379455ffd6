"""Which runs a consumer starts, and when (pure: no Kafka, no engine, no tasks; the time is passed in).

It holds the runs this consumer has read (waiting in a RunQueue, or running) and decides:
- which waiting runs take the engine's free slots: tier priority with ageing and tier slot shares
  (admission/slots.py);
- when background work (a summary) may start: only once no reply has ended here for `background_idle_s` and
  none is running or waiting, unless it has waited past `background_patience_s`;
- which running background runs a newly read reply stops (preemption).
The consumer (inference/worker.py) acts on the decisions: starts tasks, sets stop events, publishes gauges.
"""

from __future__ import annotations

from collections.abc import Callable

from admission.slots import RunQueue
from inference.run import Flight
from inference.settings import InferenceSettings


class Dispatch:
    def __init__(self, settings: InferenceSettings, tier_cap: Callable[[str], int]) -> None:
        self.slots = settings.slots
        self.patience_s = settings.background_patience_s
        self.idle_s = settings.background_idle_s
        # the most slots a tier may hold at once (its slot share of the engine)
        self.tier_cap = tier_cap
        self.queue: RunQueue[Flight] = RunQueue(settings.aging_s)
        self.flights: dict[str, Flight] = {}  # every run held here, waiting or running, by run id
        self.running: dict[str, int] = {}  # runs in the engine, by tier
        self.mean_run_s = 5.0
        # when the last reply ended here (monotonic): background runs wait for quiet
        self.last_reply = 0.0

    def __len__(self) -> int:
        """Runs waiting for a slot."""
        return len(self.queue)

    def admit(self, flight: Flight) -> bool:
        """Hold a run read from the log; False for a copy of one held already (scheduled again after a
        scheduler failed): that copy is dropped and the first one served."""
        if flight.run_id in self.flights:
            return False
        self.flights[flight.run_id] = flight
        self.queue.push(flight, flight.tier, int(flight.run.get("priority", 0)), flight.read_at)
        return True

    def yields(self, flight: Flight, now: float) -> bool:
        """Background work that still gives way to replies: past its patience it starts like any run (at its
        lowest priority) and is not stopped, so a never-quiet engine still runs it."""
        return flight.background and now - flight.read_at < self.patience_s

    def replies(self) -> bool:
        """Whether a reply (not background work) is running here or waiting for a slot."""
        return any(not f.background for f in self.flights.values())

    def to_preempt(self, now: float) -> list[Flight]:
        """The running background runs a reply just read stops (they end cancelled; the memory stage asks
        again), so a summary never takes engine time from a reply."""
        return [
            f
            for f in self.flights.values()
            if self.yields(f, now) and f.task is not None and not f.stop.is_set()
        ]

    def next_runs(self, now: float) -> list[Flight]:
        """The waiting runs to start now, best first, while the engine has free slots: each is counted as
        running from here on."""
        started: list[Flight] = []

        def may_start(tier: str) -> bool:
            return self.running.get(tier, 0) < self.tier_cap(tier)

        def may_start_run(flight: Flight) -> bool:
            if not self.yields(flight, now):
                return True
            return now - self.last_reply >= self.idle_s and not self.replies()

        while sum(self.running.values()) < self.slots:
            flight = self.queue.pop(now, may_start, may_start_run)
            if flight is None:
                break
            self.running[flight.tier] = self.running.get(flight.tier, 0) + 1
            started.append(flight)
        return started

    def ended(self, flight: Flight, now: float, took_s: float) -> None:
        """A started run is over here (finished, failed or handed off): its slot is free."""
        self.flights.pop(flight.run_id, None)
        self.running[flight.tier] -= 1
        self.mean_run_s += 0.2 * (took_s - self.mean_run_s)
        if not flight.background:
            self.last_reply = now

    def leaving(self, partitions: set[int]) -> tuple[list[Flight], list[Flight]]:
        """Partitions leaving this consumer: (their waiting runs, now forgotten here: the partitions' new owner
        reads them again; their running runs, which the caller stops and hands off)."""
        waiting = self.queue.remove(lambda f: f.partition in partitions)
        for flight in waiting:
            self.flights.pop(flight.run_id, None)
        running = [f for f in self.flights.values() if f.partition in partitions]
        return waiting, running

    def running_now(self) -> dict[str, int]:
        return {tier: n for tier, n in self.running.items() if n}
