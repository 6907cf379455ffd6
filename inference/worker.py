"""RunScheduled (one pool's topic) -> TokenDelta (the run's reply partition) + RunCompleted.

A confluent-kafka consumer, one of its pool's group, that reads runs into a bounded local queue, starts the
best waiting one whenever its engine has a free slot (tier priority with ageing, and tier slot shares:
admission/slots.py), folds each into the engine's running batch, publishes coalesced deltas to the run's
reply partition and, at the end, the run's completion. Offsets are committed only after a run's RunCompleted
is acknowledged. Every quarter second it publishes its load (PoolStatus), which the scheduler's bounded queues
are measured by.

Failure (docs/decisions/0005-inference-pools-and-takeover.md):
- A consumer killed mid-run stops heartbeating; after the session timeout its partitions go to the pool's
  other consumers, which read what the run already published and continue generating after that text.
- A partition taken away in a rebalance hands its runs off the same way: they stop between decode steps,
  what they generated is flushed to the log, and the new owner continues them.
- An unhealthy engine: the consumer leaves the group (its partitions and runs move to healthy consumers),
  says so in /metrics and the log, and rejoins once the engine answers again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import cast

from confluent_kafka import KafkaError, Message, TopicPartition

from admission.limits import LimitsView, tier_cap
from inference.control import RunControls
from inference.dispatch import Dispatch
from inference.engine import Engine
from inference.membership import Membership, position
from inference.metrics import (
    CANCEL_LATENCY,
    DUPLICATES,
    HANDED_OFF,
    HEALTHY,
    IN_FLIGHT,
    INTER_TOKEN,
    PREEMPTED,
    QUEUE_WAIT,
    QUEUED,
    TTFT,
)
from inference.pages import serve_pages
from inference.run import Flight, RunServer
from inference.settings import InferenceSettings
from runtime import failures, tracing
from runtime.kafka import AsyncProducer, dead_letter
from runtime.mcp import ToolServersView
from runtime.outage import Outage
from safety.guard_model import moderator_for
from safety.policy import PolicyView
from topics import codec
from topics.clock import now_ms
from topics.errors import PoisonEvent, RetriableError
from topics.events import PoolStatus, RunScheduled
from topics.pipeline import POOL_STATUS, RUN_CONTROL, RUN_SCHEDULED, named

log = logging.getLogger(__name__)

SLOW_START_S = 1.0  # a run starting later than this after it was scheduled is logged


class Worker:
    """The consumer's shell: it reads runs (Membership), decides which start (Dispatch), serves each as a task
    (RunServer), and keeps the engine's health, the status record and the pages."""

    def __init__(
        self,
        settings: InferenceSettings,
        engine: Engine,
        revive: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        # restarts an engine this process owns; True when it was down and came back
        self.revive = revive
        self.tracer = tracing.setup(f"parley-inference-{settings.pool}")
        self.producer = AsyncProducer(settings.kafka_bootstrap, "inference", settings.namespace)
        self.membership = Membership(settings, self._hand_off)
        self._kafka_outage = Outage(log, f"Kafka (the {settings.pool} pool's consumer)")
        self.controls = RunControls(
            settings.kafka_bootstrap, named(RUN_CONTROL, settings.namespace)
        )
        self.limits = LimitsView(settings.kafka_bootstrap, settings.namespace, "inference")
        self.policies = PolicyView(settings.kafka_bootstrap, settings.namespace, "inference")
        self.tool_servers = ToolServersView(
            settings.kafka_bootstrap, settings.namespace, "inference"
        )
        # Output moderation runs beside generation, in this process (docs/decisions/0007-safety.md).
        moderator = (
            moderator_for(settings, workers=settings.moderation_workers)
            if settings.output_moderation
            else None
        )
        self.runs = RunServer(
            settings,
            engine,
            self.producer,
            self.controls,
            self.policies,
            moderator,
            self._down,
            self.tool_servers,
        )
        self.dispatch = Dispatch(
            settings, lambda tier: tier_cap(settings.slots, self.limits.tier(tier).slot_share)
        )
        self._slot_freed = asyncio.Event()
        self._parking: set[asyncio.Task[None]] = (
            set()
        )  # poison records on their way to the dead-letter topic
        self.healthy = True
        self._stopping = asyncio.Event()

    def _down(self) -> None:
        self.healthy = False

    # -- one run -----------------------------------------------------------------------------------
    async def _run_task(self, flight: Flight) -> None:
        started = time.monotonic()
        cancel = self.controls.watch(flight.run_id)
        relay = asyncio.create_task(self._relay(cancel, flight.stop))
        try:
            with tracing.consumed_span(
                self.tracer, f"inference {self.settings.pool}", flight.msg.headers()
            ) as span:
                span.set_attribute("parley.run_id", flight.run_id)
                done = await self.runs.serve(flight)
            if done is not None:
                self.membership.commit(flight.msg)
        except Exception as exc:
            if failures.after(exc) == "retry":
                # Kafka unreachable while publishing: the offset stays uncommitted, the run is read again.
                log.warning(
                    "run %s could not be published (%s); it will be redelivered", flight.run_id, exc
                )
            else:  # a run its consumer fails on: parked with the reason, as a stage parks an event
                log.exception("run %s failed on this consumer; dead-lettered", flight.run_id)
                await self._dead_letter(flight.msg, f"{type(exc).__name__}: {exc}")
        finally:
            relay.cancel()
            self.controls.release(flight.run_id)
            IN_FLIGHT.labels(self.settings.pool).dec()
            self.dispatch.ended(flight, time.monotonic(), time.monotonic() - started)
            self._slot_freed.set()
            if not self._stopping.is_set():
                self._start_runs()  # the slot goes to the best waiting run at once

    @staticmethod
    async def _relay(source: asyncio.Event, target: asyncio.Event) -> None:
        await source.wait()
        target.set()

    async def _hand_off(self, partitions: set[int]) -> None:
        """Partitions leave: their waiting runs are dropped (the new owner reads them again) and their running
        runs stop and flush, to continue on the new owner."""
        _waiting, running = self.dispatch.leaving(partitions)
        QUEUED.labels(self.settings.pool).set(len(self.dispatch))
        for flight in running:
            flight.handing_off = True
            flight.stop.set()
        tasks = [f.task for f in running if f.task is not None]
        if tasks:
            await asyncio.wait(tasks)

    # -- engine health -----------------------------------------------------------------------------
    async def _watch_health(self) -> None:
        while not self._stopping.is_set():
            ok = await self.engine.healthy()
            if not ok and self.revive is not None:
                ok = await self.revive()
            if ok != self.healthy:
                state = "healthy again: taking work" if ok else "UNHEALTHY: not taking work"
                reason = getattr(self.engine, "unhealthy_reason", "")
                log.warning(
                    "engine %s of pool %s is %s%s",
                    self.engine.name,
                    self.settings.pool,
                    state,
                    f" ({reason})" if reason and not ok else "",
                )
            self.healthy = ok
            HEALTHY.labels(self.settings.pool).set(1 if ok else 0)
            await asyncio.sleep(self.settings.health_interval_s)

    # -- pages: metrics and health (inference/pages.py) ----------------------------------------------
    def readiness(self) -> dict[str, object]:
        """What /readyz answers: whether this consumer takes work, and why not."""
        ready = self.healthy and self.membership.subscribed
        return {
            "status": "ok" if ready else "not_taking_work",
            "pool": self.settings.pool,
            "engine": self.healthy,
        }

    # -- main loop ---------------------------------------------------------------------------------
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        pages = await serve_pages(self.settings, self.engine, self.readiness)
        self.producer.start()
        self.controls.start(loop)
        pool = self.settings.pool
        for metric in (
            TTFT,
            INTER_TOKEN,
            IN_FLIGHT,
            CANCEL_LATENCY,
            HANDED_OFF,
        ):  # present from the start
            metric.labels(pool)
        HEALTHY.labels(pool).set(1)
        await loop.run_in_executor(None, self.limits.start)
        await loop.run_in_executor(None, self.policies.start)
        await loop.run_in_executor(None, self.tool_servers.start)
        background = [
            asyncio.create_task(self._watch_health()),
            asyncio.create_task(self._publish_status()),
        ]
        log.info(
            "inference pool=%s model=%s engine=%s worker=%s consuming %s with %d slots",
            self.settings.pool,
            self.settings.model,
            self.engine.name,
            self.settings.worker_id,
            self.membership.topic,
            self.settings.slots,
        )
        member = self.membership
        try:
            while not self._stopping.is_set():
                if not self.healthy:
                    if member.subscribed:
                        await (
                            member.leave()
                        )  # our partitions, and their runs, go to the pool's healthy consumers
                    await asyncio.sleep(0.5)
                    continue
                if not member.subscribed:
                    await member.join()
                if len(self.dispatch) < self.settings.prefetch:
                    msg = await member.call(
                        member.consumer.poll, 0.05 if len(self.dispatch) else 0.2
                    )
                    error = msg.error() if msg is not None else None
                    if msg is not None and error is None:
                        try:
                            self._accept(msg)
                        except (
                            RetriableError
                        ) as exc:  # a writer schema not seen yet, and the registry is away
                            topic, partition, offset = position(msg)
                            log.warning(
                                "%s; reading %s [%d] @%d again in 1 s",
                                exc,
                                topic,
                                partition,
                                offset,
                            )
                            await member.call(
                                member.consumer.seek, TopicPartition(topic, partition, offset)
                            )
                            await asyncio.sleep(1.0)
                    elif error is not None and error.code() != KafkaError._PARTITION_EOF:
                        self._kafka_outage.failed(str(error))
                else:  # the local queue is full: wait for a slot before reading more
                    self._slot_freed.clear()
                    try:
                        await asyncio.wait_for(self._slot_freed.wait(), 0.2)
                    except TimeoutError:
                        pass
                self._start_runs()
        finally:
            self._stopping.set()
            if member.subscribed:
                await member.leave()  # hands in-flight runs off to the pool's other consumers
            tasks = [f.task for f in list(self.dispatch.flights.values()) if f.task]
            await asyncio.gather(*tasks, return_exceptions=True)
            for task in background:
                task.cancel()
            self.limits.stop()
            self.policies.stop()
            self.tool_servers.stop()
            await self.producer.close()
            self.controls.stop()
            await member.close()
            await pages.cleanup()

    async def _dead_letter(self, msg: Message, error: str) -> None:
        """Park a run's record in the dead-letter topic with where it came from and why, then commit past it
        once the parking is acknowledged (runtime/failures.py). The wait for the acknowledgement runs off the
        event loop: the runs being served keep streaming meanwhile."""
        topic, partition, offset = position(msg)
        park = functools.partial(
            dead_letter,
            self.producer.producer,
            RUN_SCHEDULED[self.settings.pool],
            self.settings.namespace,
            source=topic,
            partition=partition,
            offset=offset,
            key=msg.key(),
            value=msg.value(),
            error=error,
            stage="inference",
        )
        await asyncio.get_running_loop().run_in_executor(None, park)
        self.membership.commit(msg)

    def _accept(self, msg: Message) -> None:
        topic, partition, offset = position(msg)
        scheduled = RUN_SCHEDULED[self.settings.pool]
        try:
            run = cast(RunScheduled, codec.decode(scheduled.schema, msg.value()))
        except PoisonEvent as exc:
            self.membership.offsets.started(partition, offset)
            parking = asyncio.create_task(self._dead_letter(msg, str(exc)))
            self._parking.add(parking)  # held until done (the loop keeps only a weak reference)
            parking.add_done_callback(self._parking.discard)
            return
        self.membership.offsets.started(partition, offset)
        # A run read from before this consumer had the partition, or scheduled again after its scheduler failed,
        # may have been started by another consumer: its reply partition says.
        maybe_started = self.membership.maybe_started(partition, offset) or run.get(
            "rescheduled", False
        )
        flight = Flight(msg, run, partition, maybe_started=maybe_started)
        if not self.dispatch.admit(flight):
            log.info(
                "run %s is already here (scheduled again after a scheduler failed): dropped",
                flight.run_id,
            )
            DUPLICATES.labels(self.settings.pool).inc()
            self.membership.commit(msg)
            return
        QUEUED.labels(self.settings.pool).set(len(self.dispatch))
        if not flight.background:
            for running in self.dispatch.to_preempt(time.monotonic()):
                running.stop.set()
                PREEMPTED.labels(self.settings.pool).inc()
                log.info("background run %s stopped: a reply needs the engine", running.run_id)

    def _start_runs(self) -> None:
        """Start the best waiting runs while the engine has free slots."""
        pool = self.settings.pool
        for flight in self.dispatch.next_runs(time.monotonic()):
            IN_FLIGHT.labels(pool).inc()
            waited = time.monotonic() - flight.read_at
            QUEUE_WAIT.labels(pool, flight.tier).observe(waited)
            since_scheduled = time.time() - flight.run["scheduled_at"] / 1000
            if since_scheduled > SLOW_START_S:  # admission promised less: say where the time went
                log.info(
                    "run %s (%s) starts %.2fs after it was scheduled: %.2fs in Kafka, %.2fs waiting here; "
                    "running %s, waiting %s",
                    flight.run_id,
                    flight.tier,
                    since_scheduled,
                    since_scheduled - waited,
                    waited,
                    self.dispatch.running_now(),
                    self.dispatch.queue.by_tier(),
                )
            flight.task = asyncio.create_task(self._run_task(flight))
        QUEUED.labels(pool).set(len(self.dispatch))

    def status(self) -> PoolStatus:
        return {
            "worker_id": self.settings.worker_id,
            "pool": self.settings.pool,
            "slots": self.settings.slots,
            "healthy": self.healthy and self.membership.subscribed,
            "running": self.dispatch.running_now(),
            "queued": self.dispatch.queue.by_tier(),
            "mean_run_s": self.dispatch.mean_run_s,
            "partitions": sorted(self.membership.owned),
            "at": now_ms(),
        }

    async def _publish_status(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.producer.publish(POOL_STATUS, self.status(), key=self.settings.worker_id)
            except Exception:
                log.exception("could not publish this consumer's status")
            await asyncio.sleep(self.settings.status_interval_s)

    def stop(self) -> None:
        self._stopping.set()
