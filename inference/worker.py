"""RunScheduled -> TokenDelta (reply partition) + RunCompleted.

A confluent-kafka consumer that pulls runs only while its engine has a free slot, folds each into the
engine's running batch, publishes coalesced deltas to the run's reply partition and, at the end, the
run's completion. Offsets are committed only after a run's RunCompleted is acknowledged by the broker.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition
from opentelemetry import trace
from prometheus_client import Counter, Gauge, Histogram, start_http_server

from inference.coalesce import Coalescer
from inference.control import RunControls
from inference.engine import Engine, Outcome, Request, generate
from inference.offsets import OffsetTracker
from inference.settings import InferenceSettings
from topics import codec, tracing
from topics.codec import Event
from topics.errors import PoisonEvent
from topics.kafka import AsyncProducer, consumer_config, dead_letter
from topics.pipeline import RUN_COMPLETED, RUN_CONTROL, RUN_SCHEDULED, TOKEN_DELTA, named

log = logging.getLogger(__name__)

TTFT = Histogram(
    "parley_inference_ttft_seconds",
    "Engine time to first token",
    ["pool"],
    buckets=(0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
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
CANCEL_LATENCY = Histogram(
    "parley_inference_cancel_seconds",
    "Cancel requested (edge clock) to the engine's sequence closed",
    ["pool"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2),
)
HEALTHY = Gauge("parley_inference_engine_healthy", "1 while the engine answers its health check", ["pool"])


def position(msg: Message) -> tuple[str, int, int]:
    """topic, partition, offset of a consumed (non-error) message."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


def now_ms() -> int:
    return int(time.time() * 1000)


def delta(run: Event, seq: int, kind: str, **fields: Any) -> Event:
    prompt = run["prompt"]
    return {
        "run_id": prompt["run_id"],
        "chat_id": prompt["chat_id"],
        "seq": seq,
        "kind": kind,
        "text": "",
        "model": None,
        "finish_reason": None,
        "usage": None,
        "error_code": None,
        "error_message": None,
        "emitted_at": now_ms(),
        **fields,
    }


def completed(
    run: Event,
    text: str,
    finish_reason: str,
    usage: dict[str, int],
    ttft_ms: float,
    duration_ms: float,
    error: str | None = None,
) -> Event:
    return {
        "event_id": str(uuid.uuid4()),
        "prompt": run["prompt"],
        "pool": run["pool"],
        "model": run["model"],
        "content": text,
        "finish_reason": finish_reason,
        "usage": usage,
        "ttft_ms": ttft_ms,
        "duration_ms": duration_ms,
        "error_message": error,
        "completed_at": now_ms(),
    }


class Worker:
    def __init__(self, settings: InferenceSettings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.tracer = tracing.setup(f"parley-inference-{settings.pool}")
        self.producer = AsyncProducer(settings.kafka_bootstrap)
        self.consumer = Consumer(
            consumer_config(
                settings.kafka_bootstrap,
                settings.group(f"inference.{settings.pool}"),
                **{"max.poll.interval.ms": 600_000},
            )
        )
        self.scheduled_topic = named(RUN_SCHEDULED, settings.namespace)
        self.delta_topic = named(TOKEN_DELTA, settings.namespace)
        self.completed_topic = named(RUN_COMPLETED, settings.namespace)
        self.controls = RunControls(settings.kafka_bootstrap, named(RUN_CONTROL, settings.namespace))
        self.offsets = OffsetTracker()
        self.slots = asyncio.Semaphore(settings.slots)
        self.healthy = True
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    # -- Kafka I/O ---------------------------------------------------------------------------------
    async def _publish_delta(self, run: Event, record: Event) -> None:
        await self.producer.send(
            self.delta_topic, codec.encode(TOKEN_DELTA.schema, record), partition=run["prompt"]["reply_partition"]
        )

    # -- one run -----------------------------------------------------------------------------------
    async def serve(self, run: Event) -> Event:
        """Generate one run: started, coalesced deltas, completed (also on engine failure), then RunCompleted."""
        pool = self.settings.pool
        prompt = run["prompt"]
        started = time.perf_counter()
        await self._publish_delta(run, delta(run, 0, "started", model=run["model"]))
        request = Request(
            prompt["run_id"],
            run["model"],
            [dict(m) for m in run["messages"]],
            prompt["max_tokens"],
            self.settings.temperature if prompt.get("temperature") is None else prompt["temperature"],
        )
        cancel = self.controls.watch(prompt["run_id"])
        coalescer = Coalescer(self.settings.coalesce_ms / 1000)
        seq: int = 0
        last_emit: float | None = None
        outcome: Outcome | None = None
        error: str | None = None
        try:
            async for piece, progress in generate(self.engine, request, cancel):
                outcome = progress
                ready = coalescer.add(piece)
                if ready:
                    seq += 1
                    await self._publish_delta(run, delta(run, seq, "delta", text=ready))
                    now = time.perf_counter()
                    if last_emit is not None:
                        INTER_TOKEN.labels(pool).observe(now - last_emit)
                    last_emit = now
            rest = coalescer.drain()
            if rest:
                seq += 1
                await self._publish_delta(run, delta(run, seq, "delta", text=rest))
        except Exception as exc:  # engine failure: the run ends with an error, never hangs
            log.exception("run %s failed in the engine", prompt["run_id"])
            error = f"{type(exc).__name__}: {exc}"[:500]
        finally:
            self.controls.release(prompt["run_id"])
        if outcome is None and cancel.is_set():
            outcome = Outcome(finish_reason="cancelled")  # cancelled before the engine produced anything
        if outcome is not None and outcome.finish_reason == "cancelled":
            requested = self.controls.requested_at(prompt["run_id"])
            if requested is not None:
                CANCEL_LATENCY.labels(pool).observe(max(0.0, time.time() - requested))
            log.info("run %s cancelled after %d completion tokens", prompt["run_id"], outcome.completion_tokens)
        duration_ms = (time.perf_counter() - started) * 1000
        text = "".join(outcome.text) if outcome else ""
        usage = {
            "prompt_tokens": outcome.prompt_tokens if outcome else 0,
            "completion_tokens": outcome.completion_tokens if outcome else 0,
            "cached_tokens": outcome.cached_tokens if outcome else 0,
        }
        first = outcome.first_token_at if outcome else None
        ttft_ms = (first - started) * 1000 if first else 0.0
        finish = "error" if error else (outcome.finish_reason if outcome else "stop")
        seq += 1
        if error:
            await self._publish_delta(
                run,
                delta(
                    run,
                    seq,
                    "error",
                    error_code="engine_error",
                    error_message="The model failed while generating this answer.",
                ),
            )
        else:
            await self._publish_delta(
                run, delta(run, seq, "completed", finish_reason=finish, usage=usage, model=run["model"])
            )
        done = completed(run, text, finish, usage, ttft_ms, duration_ms, error)
        await self.producer.send(self.completed_topic, codec.encode(RUN_COMPLETED.schema, done), key=prompt["chat_id"])
        if first:
            TTFT.labels(pool).observe(first - started)
        TOKENS.labels(pool, "prompt").inc(usage["prompt_tokens"])
        TOKENS.labels(pool, "completion").inc(usage["completion_tokens"])
        RUNS.labels(pool, finish).inc()
        return done

    async def _run_task(self, msg: Message, run: Event) -> None:
        try:
            with tracing.consumed_span(self.tracer, f"inference {self.settings.pool}", msg.headers()) as span:
                span.set_attribute("parley.run_id", run["prompt"]["run_id"])
                await self.serve(run)
            self._commit(msg)
        except Exception:
            # Kafka unreachable while publishing: leave the offset uncommitted so the run is redelivered.
            log.exception("run %s could not be published; it will be redelivered", run["prompt"]["run_id"])
        finally:
            IN_FLIGHT.labels(self.settings.pool).dec()
            self.slots.release()

    def _commit(self, msg: Message) -> None:
        topic, partition, offset = position(msg)
        tp = TopicPartition(topic, partition, self.offsets.finished(partition, offset))
        self.consumer.commit(offsets=[tp], asynchronous=True)

    # -- main loop ---------------------------------------------------------------------------------
    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.offsets.forget([p.partition for p in partitions])

    async def _watch_health(self) -> None:
        while not self._stopping.is_set():
            ok = await self.engine.healthy()
            if ok != self.healthy:
                state = "healthy again" if ok else "UNHEALTHY: not taking work"
                log.warning("engine %s is %s", self.engine.name, state)
            self.healthy = ok
            HEALTHY.labels(self.settings.pool).set(1 if ok else 0)
            await asyncio.sleep(self.settings.health_interval_s)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        start_http_server(self.settings.metrics_port, addr="127.0.0.1")
        self.consumer.subscribe([self.scheduled_topic], on_revoke=self._on_revoke)
        self.producer.start()
        self.controls.start(loop)
        background = [asyncio.create_task(self._watch_health())]
        log.info(
            "inference pool=%s engine=%s consuming %s with %d slots",
            self.settings.pool,
            self.engine.name,
            self.scheduled_topic,
            self.settings.slots,
        )
        try:
            while not self._stopping.is_set():
                await self.slots.acquire()  # pull a run only when the engine has room for it
                msg = None
                while msg is None and not self._stopping.is_set():
                    if not self.healthy:
                        await asyncio.sleep(0.5)
                        continue
                    msg = await loop.run_in_executor(None, self.consumer.poll, 0.2)
                    error = msg.error() if msg is not None else None
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            log.warning("consumer error: %s", error)
                        msg = None
                if msg is None:
                    self.slots.release()
                    break
                self._accept(msg)
        finally:
            self._stopping.set()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            for task in background:
                task.cancel()
            await self.producer.close()
            self.controls.stop()
            self.consumer.close()

    def _accept(self, msg: Message) -> None:
        topic, partition, offset = position(msg)
        self.offsets.started(partition, offset)
        try:
            run = codec.decode(RUN_SCHEDULED.schema, msg.value())
        except PoisonEvent as exc:
            dead_letter(
                self.producer.producer,
                RUN_SCHEDULED,
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
            self.slots.release()
            return
        IN_FLIGHT.labels(self.settings.pool).inc()
        task = asyncio.create_task(self._run_task(msg, run))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def stop(self) -> None:
        self._stopping.set()


__all__ = ["Worker", "trace"]
