"""RunScheduled (one pool's topic) -> TokenDelta (the run's reply partition) + RunCompleted.

A confluent-kafka consumer, one of its pool's group, that reads runs into a bounded local queue, starts the
best waiting one whenever its engine has a free slot (tier priority with ageing, and tier slot shares:
inference/queue.py), folds each into the engine's running batch, publishes coalesced deltas to the run's
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
import logging
import math
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from aiohttp import web
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

from inference.coalesce import Coalescer
from inference.control import RunControls
from inference.engine import Engine, EngineDown, Outcome, Request, generate
from inference.offsets import OffsetTracker
from inference.queue import RunQueue
from inference.settings import InferenceSettings
from inference.takeover import Prior, prior_of
from safety.moderator import Moderator
from safety.output import OutputGuard
from safety.policy import PolicyView
from topics import codec, tracing
from topics.codec import Event
from topics.codec import token_delta as delta
from topics.errors import PoisonEvent, RetriableError
from topics.kafka import AsyncProducer, consumer_config, dead_letter, until_ready
from topics.limits import BACKGROUND_PRIORITY, LimitsView, tier_cap
from topics.outage import Outage
from topics.pipeline import (
    OUTPUT_MODERATED,
    POOL_STATUS,
    RUN_COMPLETED,
    RUN_CONTROL,
    RUN_SCHEDULED,
    TOKEN_DELTA,
    named,
)
from topics.reply_log import published

log = logging.getLogger(__name__)

TTFT = Histogram(
    "parley_inference_ttft_seconds",
    "Engine time to first token",
    ["pool"],
    buckets=(0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
INTER_TOKEN = Histogram(
    "parley_inference_inter_token_seconds",
    "Time between delta records",
    ["pool"],
    buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1),
)
TOKENS = Counter("parley_inference_tokens_total", "Tokens generated", ["pool", "kind"])
RUNS = Counter("parley_inference_runs_total", "Runs finished", ["pool", "finish_reason"])
IN_FLIGHT = Gauge("parley_inference_in_flight", "Runs in the engine's batch", ["pool"])
QUEUED = Gauge("parley_inference_queued", "Runs read and waiting for a slot", ["pool"])
QUEUE_WAIT = Histogram(
    "parley_inference_queue_wait_seconds",
    "Time a run waited for a slot on this consumer, by tier",
    ["pool", "tier"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
CANCEL_LATENCY = Histogram(
    "parley_inference_cancel_seconds",
    "Cancel requested (edge clock) to the engine's sequence closed",
    ["pool"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2),
)
PREEMPTED = Counter(
    "parley_inference_preempted_total", "Background runs (summaries) stopped to give the engine to a reply", ["pool"]
)
HEALTHY = Gauge("parley_inference_engine_healthy", "1 while the engine answers its health check", ["pool"])
TAKING_WORK = Gauge("parley_inference_taking_work", "1 while this consumer is in its pool's group", ["pool"])
HANDED_OFF = Counter("parley_inference_handed_off_total", "Runs stopped here to continue on another consumer", ["pool"])
DUPLICATES = Counter(
    "parley_inference_duplicates_dropped_total", "Runs scheduled again while this consumer still held them", ["pool"]
)
TAKEN_OVER = Counter(
    "parley_inference_taken_over_total", "Runs picked up after another consumer had started them", ["pool", "state"]
)


def position(msg: Message) -> tuple[str, int, int]:
    """topic, partition, offset of a consumed (non-error) message."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


def now_ms() -> int:
    return int(time.time() * 1000)


SLOW_START_S = 1.0  # a run starting later than this after it was scheduled is logged


def epoch_ms(value: Any) -> int:
    """A timestamp-millis field as decoded (datetime) or as built here (int)."""
    return int(value.timestamp() * 1000) if hasattr(value, "timestamp") else int(value)


@dataclass
class Timing:
    """What a run's usage row reports besides tokens: the gaps between its tokens, its wait before serving,
    and what the output guard did."""

    queue_ms: float = 0.0
    gaps_ms: list[float] = field(default_factory=list)
    moderation: str = "passed"

    def itl(self, q: float) -> float:
        """The q-quantile of the gaps between consecutive tokens (nearest rank; 0 with none) (pure)."""
        if not self.gaps_ms:
            return 0.0
        ranked = sorted(self.gaps_ms)
        return round(ranked[min(len(ranked) - 1, max(0, math.ceil(q * len(ranked)) - 1))], 3)


def completed(
    run: Event,
    text: str,
    finish_reason: str,
    usage: dict[str, int],
    ttft_ms: float,
    duration_ms: float,
    served_by: str,
    error: str | None = None,
    timing: Timing | None = None,
) -> Event:
    timing = timing or Timing()
    return {
        # One id per run: a RunCompleted published again after a takeover is the same event to every sink.
        "event_id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"parley:run-completed:{run['prompt']['run_id']}")),
        "prompt": run["prompt"],
        "pool": run["pool"],
        "model": run["model"],
        "content": text,
        "finish_reason": finish_reason,
        "usage": usage,
        "ttft_ms": ttft_ms,
        "duration_ms": duration_ms,
        "error_message": error,
        "served_by": served_by,
        "itl_p50_ms": timing.itl(0.5),
        "itl_p99_ms": timing.itl(0.99),
        "queue_ms": timing.queue_ms,
        "moderation": timing.moderation,
        "completed_at": now_ms(),
    }


def usage_after(prior: Prior, outcome: Outcome | None) -> dict[str, int]:
    """The run's usage (pure). A continued run's engine prompt held the text published before; that text is
    counted once, as completion, and the prompt as the user's own (the re-read is our failure's cost)."""
    if outcome is None:
        return {"prompt_tokens": 0, "completion_tokens": prior.tokens, "cached_tokens": 0}
    prompt = max(0, outcome.prompt_tokens - prior.tokens) if prior.started else outcome.prompt_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": prior.tokens + outcome.completion_tokens,
        "cached_tokens": min(outcome.cached_tokens, prompt),
    }


@dataclass
class Flight:
    """One run this consumer holds."""

    msg: Message
    run: Event
    partition: int
    maybe_started: bool  # read from before this consumer was assigned the partition: another may have begun it
    read_at: float = field(default_factory=time.monotonic)
    stop: asyncio.Event = field(default_factory=asyncio.Event)  # set by a cancel or a hand-off
    handing_off: bool = False
    task: asyncio.Task[None] | None = None

    @property
    def run_id(self) -> str:
        return str(self.run["prompt"]["run_id"])

    @property
    def tier(self) -> str:
        return str(self.run["prompt"]["tier"])

    @property
    def background(self) -> bool:
        return int(self.run.get("priority", 0)) <= BACKGROUND_PRIORITY


class Worker:
    def __init__(
        self,
        settings: InferenceSettings,
        engine: Engine,
        revive: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.revive = revive  # restarts an engine this process owns; True when it was down and came back
        self.tracer = tracing.setup(f"parley-inference-{settings.pool}")
        self.producer = AsyncProducer(settings.kafka_bootstrap, "inference", settings.namespace)
        self.consumer = Consumer(
            consumer_config(
                settings.kafka_bootstrap,
                settings.group(f"inference.{settings.pool}"),
                **{
                    "max.poll.interval.ms": 600_000,
                    "session.timeout.ms": settings.session_timeout_ms,
                    "heartbeat.interval.ms": max(500, settings.session_timeout_ms // 6),
                    # A rebalance moves only the partitions it must: chats stay on the engine holding them warm.
                    "partition.assignment.strategy": "cooperative-sticky",
                },
            )
        )
        self._kafka_outage = Outage(log, f"Kafka (the {settings.pool} pool's consumer)")
        self.scheduled_topic = named(RUN_SCHEDULED[settings.pool], settings.namespace)
        self.delta_topic = named(TOKEN_DELTA, settings.namespace)
        self.controls = RunControls(settings.kafka_bootstrap, named(RUN_CONTROL, settings.namespace))
        self.offsets = OffsetTracker()
        self.limits = LimitsView(settings.kafka_bootstrap, settings.namespace)
        self.policies = PolicyView(settings.kafka_bootstrap, settings.namespace)
        # Output moderation runs beside generation, in this process (docs/decisions/0007-safety.md).
        self.moderator = Moderator() if settings.output_moderation else None
        self.queue: RunQueue[Flight] = RunQueue(settings.aging_s)
        self.running: dict[str, int] = {}  # runs in the engine, by tier
        self.mean_run_s = 5.0
        self._slot_freed = asyncio.Event()
        self._last_reply = 0.0  # when the last reply ended here (monotonic): background runs wait for quiet
        self.healthy = True
        self.flights: dict[str, Flight] = {}
        self.fresh_from: dict[int, int] = {}  # partition -> its end when assigned: later records are new runs
        self.owned: frozenset[int] = frozenset()  # partitions assigned now (published in the status)
        self._kafka = ThreadPoolExecutor(1, thread_name_prefix="consumer")  # every consumer call, one thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self._subscribed = False
        self._stopping = asyncio.Event()

    # -- Kafka I/O ---------------------------------------------------------------------------------
    async def _publish_delta(self, run: Event, record: Event) -> None:
        await self.producer.publish(TOKEN_DELTA, record, partition=run["prompt"]["reply_partition"])

    async def _consumer_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        assert self._loop is not None
        return await self._loop.run_in_executor(self._kafka, fn, *args)

    # -- one run -----------------------------------------------------------------------------------
    async def _prior(self, flight: Flight) -> Prior:
        if not flight.maybe_started:
            return Prior()
        prompt = flight.run["prompt"]
        assert self._loop is not None
        records = await self._loop.run_in_executor(
            None,
            published,
            self.settings.kafka_bootstrap,
            self.delta_topic,
            prompt["reply_partition"],
            prompt["run_id"],
            epoch_ms(flight.run["scheduled_at"]),
            self.settings.group("inference.takeover"),
        )
        prior = prior_of(records)
        if prior.started:
            state = "ended" if prior.terminal else "continued"
            TAKEN_OVER.labels(self.settings.pool, state).inc()
            log.info(
                "run %s was started by another consumer (%d records, %d tokens published): %s here",
                prompt["run_id"],
                prior.seq + 1,
                prior.tokens,
                state,
            )
        return prior

    async def serve(self, flight: Flight) -> Event | None:
        """Generate one run: started, coalesced deltas, completed (also on failure), then RunCompleted.

        Returns None when the run was handed off (to continue on another consumer): nothing final published.
        """
        run, pool = flight.run, self.settings.pool
        prompt = run["prompt"]
        prior = await self._prior(flight)
        if prior.terminal is not None:
            return await self._finish_ended(run, prior)
        started = time.perf_counter()
        age_s = time.time() - epoch_ms(run["scheduled_at"]) / 1000
        timing = Timing(queue_ms=round(max(0.0, age_s) * 1000, 1))
        if age_s > self.settings.run_deadline_s:
            log.warning("run %s expired: scheduled %.0fs ago, never served", prompt["run_id"], age_s)
            return await self._finish(
                run,
                prior,
                prior.seq + 1,
                outcome=None,
                started=started,
                error=("run_expired", "No model server could take this request in time. Please try again."),
                timing=timing,
            )
        if prior.started and prior.tokens >= prompt["max_tokens"]:  # it had reached its limit when it stopped
            return await self._finish(
                run,
                prior,
                prior.seq + 1,
                outcome=Outcome(finish_reason="length"),
                started=started,
                error=None,
                timing=timing,
            )
        seq = prior.seq
        if not prior.started:
            seq = 0
            await self._publish_delta(run, delta(run, 0, "started", model=run["model"]))
        request = Request(
            prompt["run_id"],
            run["model"],
            [dict(m) for m in run["messages"]],
            prompt["max_tokens"] - prior.tokens,
            self.settings.temperature if prompt.get("temperature") is None else prompt["temperature"],
            continuation=prior.text,
        )
        coalescer = Coalescer(self.settings.coalesce_ms / 1000)
        guard = None
        # A background run (a summary) is never shown, so there is nothing to retract as it streams; what it
        # puts into later prompts is screened by the scheduler's context guard, and the replies those prompts
        # produce by this guard. Screening it here only lost summaries to false retractions.
        if self.moderator is not None and not flight.background:
            policy = self.policies.for_tier(prompt["tier"])
            window = self.settings.moderation_window_tokens
            guard = OutputGuard(self.moderator, policy, flight.stop.set, window, prior.text)
        else:
            timing.moderation = "unscreened"
        last_emit: float | None = None
        last_piece: float | None = None
        outcome: Outcome | None = None
        failure: tuple[str, str] | None = None
        try:
            async for piece, progress in generate(self.engine, request, flight.stop):
                outcome = progress
                arrived = time.perf_counter()
                if last_piece is not None:
                    timing.gaps_ms.append((arrived - last_piece) * 1000)
                last_piece = arrived
                if guard is not None:
                    guard.feed(piece, prior.tokens + progress.pieces)
                ready = coalescer.add(piece)
                if ready:
                    seq += 1
                    tokens = prior.tokens + progress.completion_tokens
                    await self._publish_delta(run, delta(run, seq, "delta", text=ready, tokens=tokens))
                    now = time.perf_counter()
                    if last_emit is not None:
                        INTER_TOKEN.labels(pool).observe(now - last_emit)
                    last_emit = now
        except EngineDown as exc:
            log.warning("run %s: engine failed mid-run (%s); handing the run off", prompt["run_id"], exc)
            self.healthy = False
            flight.handing_off = True
        except Exception as exc:  # the engine refused the request: the run ends with an error, never hangs
            log.exception("run %s failed in the engine", prompt["run_id"])
            failure = ("engine_error", f"The model failed while generating this answer ({type(exc).__name__}).")
        rest = coalescer.drain()
        if rest:  # generated text is published even when the run stops here, so a successor continues after it
            seq += 1
            tokens = prior.tokens + (outcome.completion_tokens if outcome else 0)
            await self._publish_delta(run, delta(run, seq, "delta", text=rest, tokens=tokens))
        if flight.handing_off:
            HANDED_OFF.labels(pool).inc()
            log.info("run %s handed off after %d records", prompt["run_id"], seq + 1)
            return None
        if guard is not None:
            await guard.finish()  # the last window is checked before the stream ends
            if guard.blocked is not None:
                seq += 1
                await self._publish_delta(run, self._retraction(run, seq, guard))
        if outcome is None and flight.stop.is_set():
            outcome = Outcome(finish_reason="cancelled")  # cancelled before the engine produced anything
        if outcome is not None and outcome.finish_reason == "cancelled":
            requested = self.controls.requested_at(prompt["run_id"])
            if requested is not None:
                CANCEL_LATENCY.labels(pool).observe(max(0.0, time.time() - requested))
            log.info("run %s cancelled after %d completion tokens", prompt["run_id"], outcome.completion_tokens)
        return await self._finish(
            run, prior, seq + 1, outcome=outcome, started=started, error=failure, guard=guard, timing=timing
        )

    @staticmethod
    def _retraction(run: Event, seq: int, guard: OutputGuard) -> Event:
        assert guard.blocked is not None
        return delta(
            run,
            seq,
            "moderation",
            category=guard.blocked.decision.category,
            retract_from=guard.retract_from,
            error_message="Part of this answer was withdrawn by the content policy.",
        )

    async def _finish(
        self,
        run: Event,
        prior: Prior,
        seq: int,
        *,
        outcome: Outcome | None,
        started: float,
        error: tuple[str, str] | None,
        guard: OutputGuard | None = None,
        timing: Timing | None = None,
    ) -> Event:
        """Publish the terminal delta and RunCompleted (and the run's output moderation)."""
        pool = self.settings.pool
        usage = usage_after(prior, outcome)
        text = prior.text + ("".join(outcome.text) if outcome else "")
        first = outcome.first_token_at if outcome else None
        ttft_ms = (first - started) * 1000 if first else 0.0
        finish = "error" if error else (outcome.finish_reason if outcome else "stop")
        if guard is not None and guard.blocked is not None:
            text, finish = guard.kept(), "content_filter"  # what was retracted is never stored
            timing = timing or Timing()
            timing.moderation = f"retracted:{guard.blocked.decision.category}"
        tokens = usage["completion_tokens"]
        if error:
            terminal = delta(run, seq, "error", error_code=error[0], error_message=error[1], tokens=tokens)
        else:
            terminal = delta(
                run, seq, "completed", finish_reason=finish, usage=usage, model=run["model"], tokens=tokens
            )
        await self._publish_delta(run, terminal)
        duration_ms = (time.perf_counter() - started) * 1000
        message = error[1] if error else None
        done = completed(run, text, finish, usage, ttft_ms, duration_ms, self.settings.worker_id, message, timing)
        await self.producer.publish(RUN_COMPLETED, done, key=run["prompt"]["chat_id"])
        if guard is not None:
            await self.producer.publish(OUTPUT_MODERATED, guard.event(run), key=run["prompt"]["chat_id"])
        if first:
            TTFT.labels(pool).observe(first - started)
        TOKENS.labels(pool, "prompt").inc(usage["prompt_tokens"])
        TOKENS.labels(pool, "cached").inc(usage["cached_tokens"])
        TOKENS.labels(pool, "completion").inc(usage["completion_tokens"])
        RUNS.labels(pool, finish).inc()
        return done

    async def _finish_ended(self, run: Event, prior: Prior) -> Event:
        """A run whose consumer died after its terminal delta: publish its RunCompleted from the log."""
        terminal = prior.terminal
        assert terminal is not None
        error = terminal["kind"] == "error"
        usage = terminal["usage"] or {"prompt_tokens": 0, "completion_tokens": prior.tokens, "cached_tokens": 0}
        finish = "error" if error else terminal["finish_reason"] or "stop"
        message = terminal["error_message"] if error else None
        timing = Timing(moderation="retracted" if finish == "content_filter" else "passed")  # category: in the log
        done = completed(run, prior.text, finish, usage, 0.0, 0.0, self.settings.worker_id, message, timing)
        await self.producer.publish(RUN_COMPLETED, done, key=run["prompt"]["chat_id"])
        return done

    async def _run_task(self, flight: Flight) -> None:
        started = time.monotonic()
        cancel = self.controls.watch(flight.run_id)
        relay = asyncio.create_task(self._relay(cancel, flight.stop))
        try:
            with tracing.consumed_span(self.tracer, f"inference {self.settings.pool}", flight.msg.headers()) as span:
                span.set_attribute("parley.run_id", flight.run_id)
                done = await self.serve(flight)
            if done is not None:
                self._commit(flight.msg)
        except Exception:
            # Kafka unreachable while publishing: leave the offset uncommitted so the run is redelivered.
            log.exception("run %s could not be published; it will be redelivered", flight.run_id)
        finally:
            relay.cancel()
            self.controls.release(flight.run_id)
            self.flights.pop(flight.run_id, None)
            IN_FLIGHT.labels(self.settings.pool).dec()
            self.running[flight.tier] -= 1
            self.mean_run_s += 0.2 * (time.monotonic() - started - self.mean_run_s)
            if not flight.background:
                self._last_reply = time.monotonic()
            self._slot_freed.set()
            if not self._stopping.is_set():
                self._dispatch()  # the slot goes to the best waiting run at once

    @staticmethod
    async def _relay(source: asyncio.Event, target: asyncio.Event) -> None:
        await source.wait()
        target.set()

    def _commit(self, msg: Message) -> None:
        topic, partition, offset = position(msg)
        tp = TopicPartition(topic, partition, self.offsets.finished(partition, offset))
        self.consumer.commit(offsets=[tp], asynchronous=True)

    # -- group membership --------------------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.fresh_from[tp.partition] = self._end_now(consumer, tp)
        self.owned = self.owned | {tp.partition for tp in partitions}  # rebound, not mutated: status() reads it
        if partitions:
            numbers = sorted(tp.partition for tp in partitions)
            log.info("assigned partitions %s of %s", numbers, self.scheduled_topic)

    @staticmethod
    def _end_now(consumer: Consumer, tp: TopicPartition, timeout_s: float = 15.0) -> int:
        """The partition's end as of its assignment, asked again while a broker that just died leaves errors
        behind. An error must not leave the rebalance callback: it surfaces from poll() and ended the consumer
        thread (CI: "Broker handle destroyed" after the leader broker's kill -9, the pool's partitions then
        unserved for minutes). Unknown after timeout_s: every record already there counts as maybe started,
        so each is checked against its reply partition before it runs."""
        ask = partial(consumer.get_watermark_offsets, TopicPartition(tp.topic, tp.partition), timeout=5)
        try:
            return int(until_ready(f"end of partition {tp.partition}", ask, timeout_s)[1])
        except Exception as exc:  # nothing may escape the callback
            log.warning("end of partition %d unknown (%s): its waiting runs are checked", tp.partition, exc)
            return sys.maxsize

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Runs of partitions leaving this consumer stop and flush what they generated before the partitions
        go (this blocks the rebalance briefly), so their new owner continues each run where it stopped."""
        numbers = {tp.partition for tp in partitions}
        self.owned = self.owned - numbers
        if not numbers:
            return
        assert self._loop is not None
        handed = asyncio.run_coroutine_threadsafe(self._hand_off(numbers), self._loop)
        try:
            handed.result(timeout=60)
        except Exception:
            log.exception("hand-off of partitions %s did not finish", sorted(numbers))
        self.offsets.forget(list(numbers))
        for number in numbers:
            self.fresh_from.pop(number, None)
        log.info("revoked partitions %s of %s", sorted(numbers), self.scheduled_topic)

    async def _hand_off(self, partitions: set[int]) -> None:
        for waiting in self.queue.remove(lambda f: f.partition in partitions):
            self.flights.pop(waiting.run_id, None)  # not started here: its new owner reads it again
        QUEUED.labels(self.settings.pool).set(len(self.queue))
        leaving = [f for f in self.flights.values() if f.partition in partitions]
        for flight in leaving:
            flight.handing_off = True
            flight.stop.set()
        tasks = [f.task for f in leaving if f.task is not None]
        if tasks:
            await asyncio.wait(tasks)

    async def _join(self) -> None:
        await self._consumer_call(
            lambda: self.consumer.subscribe(
                [self.scheduled_topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke
            )
        )
        self._subscribed = True
        TAKING_WORK.labels(self.settings.pool).set(1)

    async def _leave(self) -> None:
        def leave() -> None:
            self.consumer.unsubscribe()
            deadline = time.monotonic() + 30
            while self.consumer.assignment() and time.monotonic() < deadline:
                self.consumer.poll(0.1)  # serves the revoke (hand-off); a record read now stays uncommitted

        await self._consumer_call(leave)
        self._subscribed = False
        TAKING_WORK.labels(self.settings.pool).set(0)

    # -- engine health -----------------------------------------------------------------------------
    async def _watch_health(self) -> None:
        while not self._stopping.is_set():
            ok = await self.engine.healthy()
            if not ok and self.revive is not None:
                ok = await self.revive()
            if ok != self.healthy:
                state = "healthy again: taking work" if ok else "UNHEALTHY: not taking work"
                log.warning("engine %s of pool %s is %s", self.engine.name, self.settings.pool, state)
            self.healthy = ok
            HEALTHY.labels(self.settings.pool).set(1 if ok else 0)
            await asyncio.sleep(self.settings.health_interval_s)

    # -- pages: metrics and health -----------------------------------------------------------------
    async def _serve_pages(self) -> web.AppRunner:
        """/metrics for the scraper; /livez (the event loop answers) and /readyz (the engine is healthy and this
        consumer is in its pool's group, so it takes work: 503 while it is out) for probes."""

        async def metrics(_request: web.Request) -> web.Response:
            return web.Response(body=generate_latest(), content_type=CONTENT_TYPE_LATEST.split(";")[0])

        async def livez(_request: web.Request) -> web.Response:
            return web.json_response({"status": "ok", "pool": self.settings.pool})

        async def readyz(_request: web.Request) -> web.Response:
            ready = self.healthy and self._subscribed
            body = {"status": "ok" if ready else "not_taking_work", "pool": self.settings.pool, "engine": self.healthy}
            return web.json_response(body, status=200 if ready else 503)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/livez", livez)
        app.router.add_get("/readyz", readyz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, self.settings.host, self.settings.metrics_port).start()
        return runner

    # -- main loop ---------------------------------------------------------------------------------
    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        pages = await self._serve_pages()
        self.producer.start()
        self.controls.start(self._loop)
        pool = self.settings.pool
        for metric in (TTFT, INTER_TOKEN, IN_FLIGHT, CANCEL_LATENCY, HANDED_OFF):  # present from the start
            metric.labels(pool)
        HEALTHY.labels(pool).set(1)
        await self._loop.run_in_executor(None, self.limits.start)
        await self._loop.run_in_executor(None, self.policies.start)
        background = [asyncio.create_task(self._watch_health()), asyncio.create_task(self._publish_status())]
        log.info(
            "inference pool=%s model=%s engine=%s worker=%s consuming %s with %d slots",
            self.settings.pool,
            self.settings.model,
            self.engine.name,
            self.settings.worker_id,
            self.scheduled_topic,
            self.settings.slots,
        )
        try:
            while not self._stopping.is_set():
                if not self.healthy:
                    if self._subscribed:
                        await self._leave()  # our partitions, and their runs, go to the pool's healthy consumers
                    await asyncio.sleep(0.5)
                    continue
                if not self._subscribed:
                    await self._join()
                if len(self.queue) < self.settings.prefetch:
                    msg = await self._consumer_call(self.consumer.poll, 0.05 if len(self.queue) else 0.2)
                    error = msg.error() if msg is not None else None
                    if msg is not None and error is None:
                        try:
                            self._accept(msg)
                        except RetriableError as exc:  # a writer schema not seen yet, and the registry is away
                            topic, partition, offset = position(msg)
                            log.warning("%s; reading %s [%d] @%d again in 1 s", exc, topic, partition, offset)
                            await self._consumer_call(self.consumer.seek, TopicPartition(topic, partition, offset))
                            await asyncio.sleep(1.0)
                    elif error is not None and error.code() != KafkaError._PARTITION_EOF:
                        self._kafka_outage.failed(str(error))
                else:  # the local queue is full: wait for a slot before reading more
                    self._slot_freed.clear()
                    try:
                        await asyncio.wait_for(self._slot_freed.wait(), 0.2)
                    except TimeoutError:
                        pass
                self._dispatch()
        finally:
            self._stopping.set()
            if self._subscribed:
                await self._leave()  # hands in-flight runs off to the pool's other consumers
            await asyncio.gather(*(f.task for f in list(self.flights.values()) if f.task), return_exceptions=True)
            for task in background:
                task.cancel()
            self.limits.stop()
            self.policies.stop()
            await self.producer.close()
            self.controls.stop()
            await self._consumer_call(self.consumer.close)
            self._kafka.shutdown()
            await pages.cleanup()

    def _accept(self, msg: Message) -> None:
        topic, partition, offset = position(msg)
        try:
            run = codec.decode(RUN_SCHEDULED[self.settings.pool].schema, msg.value())
        except PoisonEvent as exc:
            self.offsets.started(partition, offset)
            dead_letter(
                self.producer.producer,
                RUN_SCHEDULED[self.settings.pool],
                self.settings.namespace,
                source=topic,
                partition=partition,
                offset=offset,
                key=msg.key(),
                value=msg.value(),
                error=str(exc),
                stage="inference",
            )
            self._commit(msg)
            return
        self.offsets.started(partition, offset)
        # A run read from before this consumer had the partition, or scheduled again after its scheduler failed,
        # may have been started by another consumer: its reply partition says.
        maybe_started = offset < self.fresh_from.get(partition, 0) or run.get("rescheduled", False)
        flight = Flight(msg, run, partition, maybe_started=maybe_started)
        if flight.run_id in self.flights:  # a copy scheduled again while the first is still here: serve that one
            log.info("run %s is already here (scheduled again after a scheduler failed): dropped", flight.run_id)
            DUPLICATES.labels(self.settings.pool).inc()
            self._commit(msg)
            return
        self.flights[flight.run_id] = flight
        self.queue.push(flight, flight.tier, run.get("priority", 0), flight.read_at)
        QUEUED.labels(self.settings.pool).set(len(self.queue))
        if not flight.background:
            self._preempt()

    def _yields(self, flight: Flight) -> bool:
        """Background work that still gives way to replies: past `background_patience_s` of waiting here it
        starts like any run (at its lowest priority) and is not stopped, so a never-quiet engine still runs it."""
        return flight.background and time.monotonic() - flight.read_at < self.settings.background_patience_s

    def _may_start_run(self, flight: Flight) -> bool:
        if not self._yields(flight):
            return True
        quiet = time.monotonic() - self._last_reply >= self.settings.background_idle_s
        return quiet and not self._replies()

    def _replies(self) -> bool:
        """Whether a reply (not background work) is running here or waiting for a slot."""
        return any(not f.background for f in self.flights.values())

    def _preempt(self) -> None:
        """A reply arrived: running background runs stop (they end cancelled; the memory stage asks again),
        so a summary never takes engine time from a reply."""
        for f in self.flights.values():
            if self._yields(f) and f.task is not None and not f.stop.is_set():
                f.stop.set()
                PREEMPTED.labels(self.settings.pool).inc()
                log.info("background run %s stopped: a reply needs the engine", f.run_id)

    def _may_start(self, tier: str) -> bool:
        cap = tier_cap(self.settings.slots, self.limits.tier(tier).slot_share)
        return self.running.get(tier, 0) < cap

    def _dispatch(self) -> None:
        """Start the best waiting runs while the engine has free slots."""
        pool = self.settings.pool
        while sum(self.running.values()) < self.settings.slots:
            flight = self.queue.pop(time.monotonic(), self._may_start, self._may_start_run)
            if flight is None:
                break
            self.running[flight.tier] = self.running.get(flight.tier, 0) + 1
            IN_FLIGHT.labels(pool).inc()
            waited = time.monotonic() - flight.read_at
            QUEUE_WAIT.labels(pool, flight.tier).observe(waited)
            since_scheduled = time.time() - epoch_ms(flight.run["scheduled_at"]) / 1000
            if since_scheduled > SLOW_START_S:  # admission promised less: say where the time went
                log.info(
                    "run %s (%s) starts %.2fs after it was scheduled: %.2fs in Kafka, %.2fs waiting here; "
                    "running %s, waiting %s",
                    flight.run_id,
                    flight.tier,
                    since_scheduled,
                    since_scheduled - waited,
                    waited,
                    dict(self.running),
                    self.queue.by_tier(),
                )
            flight.task = asyncio.create_task(self._run_task(flight))
        QUEUED.labels(pool).set(len(self.queue))

    def status(self) -> Event:
        return {
            "worker_id": self.settings.worker_id,
            "pool": self.settings.pool,
            "slots": self.settings.slots,
            "healthy": self.healthy and self._subscribed,
            "running": {t: n for t, n in self.running.items() if n},
            "queued": self.queue.by_tier(),
            "mean_run_s": self.mean_run_s,
            "partitions": sorted(self.owned),
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
