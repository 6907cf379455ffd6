"""One run on this consumer: what it holds of it (Flight) and how it is served (RunServer): started,
coalesced deltas to its reply partition with the output guard beside, its terminal delta and RunCompleted.
A run another consumer had begun is continued after the text it published (inference/takeover.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Message

from admission.limits import BACKGROUND_PRIORITY
from conversation.tokens import load as load_tokenizer
from inference import calls
from inference.coalesce import Coalescer
from inference.completion import Timing, completed, usage_after
from inference.control import RunControls
from inference.engine import Engine, EngineDown, Outcome, Request, generate
from inference.metrics import (
    CANCEL_LATENCY,
    HANDED_OFF,
    INTER_TOKEN,
    RUNS,
    TAKEN_OVER,
    TOKENS,
    TTFT,
)
from inference.settings import InferenceSettings
from inference.takeover import Prior, prior_of
from runtime.kafka import AsyncProducer
from runtime.reply_log import published
from safety.moderator import Moderator
from safety.output import OutputGuard
from safety.policy import PolicyView
from topics.events import RunCompleted, RunScheduled, TokenDelta, Usage
from topics.pipeline import OUTPUT_MODERATED, RUN_COMPLETED, TOKEN_DELTA, named
from topics.records import token_delta as delta

log = logging.getLogger(__name__)


@dataclass
class Flight:
    """One run this consumer holds."""

    msg: Message
    run: RunScheduled
    partition: int
    # read from before this consumer was assigned the partition: another may have begun it
    maybe_started: bool
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
        return self.run["priority"] <= BACKGROUND_PRIORITY


class RunServer:
    """Serves runs on one engine and publishes what they produce; shared by every run of the consumer."""

    def __init__(
        self,
        settings: InferenceSettings,
        engine: Engine,
        producer: AsyncProducer,
        controls: RunControls,
        policies: PolicyView,
        moderator: Moderator | None,
        engine_down: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.producer = producer
        self.controls = controls
        self.policies = policies
        self.moderator = moderator  # None: output moderation is off (docs/decisions/0007-safety.md)
        self.engine_down = engine_down  # the engine failed mid-run: the consumer stops taking work

    async def _publish_delta(self, run: RunScheduled, record: TokenDelta) -> None:
        await self.producer.publish(TOKEN_DELTA, record, partition=run["prompt"]["reply_partition"])

    async def prior(self, flight: Flight) -> Prior:
        """What another consumer already published of this run (nothing unless it may have begun it)."""
        if not flight.maybe_started:
            return Prior()
        prompt = flight.run["prompt"]
        records = await asyncio.get_running_loop().run_in_executor(
            None,
            published,
            self.settings.kafka_bootstrap,
            named(TOKEN_DELTA, self.settings.namespace),
            prompt["reply_partition"],
            prompt["run_id"],
            flight.run["scheduled_at"],
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

    def _clamped(
        self, run_id: str, messages: list[dict[str, str]], text: str, max_tokens: int
    ) -> int:
        """What is left of a continued answer's `max_tokens` once its text is back in the prompt: re-tokenized,
        it can count more tokens than were generated, and the engine refuses a request beyond the pool's
        context (SGLang's 400 above --context-length)."""
        pool = self.settings.pools[self.settings.pool]
        held = load_tokenizer(pool.tokenizer).count_continued(messages, text)
        room = pool.context - held
        if room >= max_tokens:
            return max_tokens
        log.info(
            "run %s: continuation holds %d tokens; the rest of its answer is clamped from %d to %d",
            run_id,
            held,
            max_tokens,
            max(room, 0),
        )
        return room

    async def serve(self, flight: Flight) -> RunCompleted | None:
        """Generate one run: started, coalesced deltas, completed (also on failure), then RunCompleted.

        Returns None when the run was handed off (to continue on another consumer): nothing final published.
        """
        run, pool = flight.run, self.settings.pool
        prompt = run["prompt"]
        prior = await self.prior(flight)
        if prior.terminal is not None:
            return await self._finish_ended(run, prior)
        started = time.perf_counter()
        age_s = time.time() - run["scheduled_at"] / 1000
        timing = Timing(queue_ms=round(max(0.0, age_s) * 1000, 1))
        if age_s > self.settings.run_deadline_s:
            log.warning(
                "run %s expired: scheduled %.0fs ago, never served", prompt["run_id"], age_s
            )
            return await self._finish(
                run,
                prior,
                prior.seq + 1,
                outcome=None,
                started=started,
                error=(
                    "run_expired",
                    "No model server could take this request in time. Please try again.",
                ),
                timing=timing,
            )
        messages = [calls.engine_message(m) for m in run["messages"]]
        max_tokens = prompt["max_tokens"] - prior.tokens
        if prior.text and max_tokens > 0:
            max_tokens = self._clamped(prompt["run_id"], messages, prior.text, max_tokens)
        if (
            prior.started and max_tokens <= 0
        ):  # it had reached its limit, or its context, when it stopped
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
        options, forced = calls.engine_options(prompt.get("generation"))
        request = Request(
            prompt["run_id"],
            run["model"],
            messages,
            max_tokens,
            self.settings.temperature if (t := prompt.get("temperature")) is None else t,
            continuation=prior.text,
            priority=run["priority"],
            options=options,
            forced_calls=forced,
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
        last_record = time.perf_counter()
        last_piece: float | None = None
        outcome: Outcome | None = None
        failure: tuple[str, str] | None = None
        try:
            async for piece, progress in generate(
                self.engine, request, flight.stop, heartbeat_s=self.settings.keepalive_s or None
            ):
                outcome = progress
                arrived = time.perf_counter()
                if (
                    piece
                ):  # between tokens: not the prefill, which the engine may report step by step
                    if last_piece is not None:
                        timing.gaps_ms.append((arrived - last_piece) * 1000)
                    last_piece = arrived
                if guard is not None:
                    guard.feed(piece, prior.tokens + progress.pieces)
                ready = coalescer.add(piece)
                if (
                    ready or arrived - last_record >= self.settings.keepalive_s
                ):  # text, or a keepalive (prefill)
                    seq += 1
                    tokens = prior.tokens + progress.completion_tokens
                    await self._publish_delta(
                        run, delta(run, seq, "delta", text=ready or "", tokens=tokens)
                    )
                    last_record = time.perf_counter()
                    if ready:
                        if last_emit is not None:
                            INTER_TOKEN.labels(pool).observe(last_record - last_emit)
                        last_emit = last_record
        except EngineDown as exc:
            log.warning(
                "run %s: engine failed mid-run (%s); handing the run off", prompt["run_id"], exc
            )
            self.engine_down()
            flight.handing_off = True
        except (
            Exception
        ) as exc:  # the engine refused the request: the run ends with an error, never hangs
            log.exception("run %s failed in the engine", prompt["run_id"])
            failure = (
                "engine_error",
                f"The model failed while generating this answer ({type(exc).__name__}).",
            )
        rest = coalescer.drain()
        if forced and outcome is not None and not outcome.tool_calls:
            rest += "".join(
                outcome.text
            )  # not whole calls (cut by max_tokens): the text as it came
        if rest:  # generated text is published even when the run stops here, so a successor continues after it
            seq += 1
            tokens = prior.tokens + (outcome.completion_tokens if outcome else 0)
            await self._publish_delta(run, delta(run, seq, "delta", text=rest, tokens=tokens))
        if outcome is not None and outcome.tool_calls and not flight.handing_off:
            seq += 1
            made = json.dumps(outcome.tool_calls)
            tokens = prior.tokens + outcome.completion_tokens
            await self._publish_delta(run, delta(run, seq, "delta", tool_calls=made, tokens=tokens))
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
            outcome = Outcome(
                finish_reason="cancelled"
            )  # cancelled before the engine produced anything
        if outcome is not None and outcome.finish_reason == "cancelled":
            requested = self.controls.requested_at(prompt["run_id"])
            if requested is not None:
                CANCEL_LATENCY.labels(pool).observe(max(0.0, time.time() - requested))
            log.info(
                "run %s cancelled after %d completion tokens",
                prompt["run_id"],
                outcome.completion_tokens,
            )
        return await self._finish(
            run,
            prior,
            seq + 1,
            outcome=outcome,
            started=started,
            error=failure,
            guard=guard,
            timing=timing,
        )

    @staticmethod
    def _retraction(run: RunScheduled, seq: int, guard: OutputGuard) -> TokenDelta:
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
        run: RunScheduled,
        prior: Prior,
        seq: int,
        *,
        outcome: Outcome | None,
        started: float,
        error: tuple[str, str] | None,
        guard: OutputGuard | None = None,
        timing: Timing | None = None,
    ) -> RunCompleted:
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
            terminal = delta(
                run, seq, "error", error_code=error[0], error_message=error[1], tokens=tokens
            )
        else:
            terminal = delta(
                run,
                seq,
                "completed",
                finish_reason=finish,
                usage=usage,
                model=run["model"],
                tokens=tokens,
            )
        await self._publish_delta(run, terminal)
        duration_ms = (time.perf_counter() - started) * 1000
        message = error[1] if error else None
        done = completed(
            run, text, finish, usage, ttft_ms, duration_ms, self.settings.worker_id, message, timing
        )
        await self.producer.publish(RUN_COMPLETED, done, key=run["prompt"]["chat_id"])
        if guard is not None:
            await self.producer.publish(
                OUTPUT_MODERATED, guard.event(run), key=run["prompt"]["chat_id"]
            )
        if first:
            TTFT.labels(pool).observe(first - started)
        TOKENS.labels(pool, "prompt").inc(usage["prompt_tokens"])
        TOKENS.labels(pool, "cached").inc(usage["cached_tokens"])
        TOKENS.labels(pool, "completion").inc(usage["completion_tokens"])
        RUNS.labels(pool, finish).inc()
        return done

    async def _finish_ended(self, run: RunScheduled, prior: Prior) -> RunCompleted:
        """A run whose consumer died after its terminal delta: publish its RunCompleted from the log."""
        terminal = prior.terminal
        assert terminal is not None
        error = terminal["kind"] == "error"
        usage: Usage = terminal["usage"] or {
            "prompt_tokens": 0,
            "completion_tokens": prior.tokens,
            "cached_tokens": 0,
        }
        finish = "error" if error else terminal["finish_reason"] or "stop"
        message = terminal["error_message"] if error else None
        timing = Timing(
            moderation="retracted" if finish == "content_filter" else "passed"
        )  # category: in the log
        done = completed(
            run, prior.text, finish, usage, 0.0, 0.0, self.settings.worker_id, message, timing
        )
        await self.producer.publish(RUN_COMPLETED, done, key=run["prompt"]["chat_id"])
        return done
