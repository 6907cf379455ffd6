"""One run on this consumer: what it holds of it (Flight) and how it is served (RunServer): started,
coalesced deltas to its reply partition with the output guard beside, its terminal delta and RunCompleted.
A run another consumer had begun is continued after the text it published (inference/takeover.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from confluent_kafka import Message

from admission.limits import BACKGROUND_PRIORITY
from conversation.gather import ContextGuard
from conversation.tokens import load as load_tokenizer
from inference import calls, tools
from inference.coalesce import Coalescer
from inference.completion import Timing, completed, usage_after
from inference.control import RunControls
from inference.engine import Engine, Outcome, Request
from inference.metrics import (
    CANCEL_LATENCY,
    HANDED_OFF,
    RUNS,
    TAKEN_OVER,
    TOKENS,
    TTFT,
)
from inference.settings import InferenceSettings
from inference.step import Steps
from inference.takeover import Prior, prior_of
from runtime.kafka import AsyncProducer
from runtime.mcp import ToolServersView
from runtime.reply_log import published
from safety.moderator import Moderator
from safety.output import OutputGuard
from safety.policy import PolicyView
from topics.events import RunCompleted, RunScheduled, TokenDelta, ToolUse, Usage
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
        tool_servers: ToolServersView | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.producer = producer
        self.controls = controls
        self.policies = policies
        self.moderator = moderator  # None: output moderation is off (docs/decisions/0007-safety.md)
        self.engine_down = engine_down  # the engine failed mid-run: the consumer stops taking work
        self.tool_servers = tool_servers  # the registered MCP servers a run's tools are called on
        self.steps = Steps(settings, engine, self._publish_delta, engine_down)

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
        steps = self._tool_steps(run, prior)
        messages = [calls.engine_message(m) for m in run["messages"]] + (
            prior.steps if steps else []
        )
        continued = prior.tail if steps else prior.text
        max_tokens = prompt["max_tokens"] - prior.tokens
        if continued and max_tokens > 0:
            max_tokens = self._clamped(prompt["run_id"], messages, continued, max_tokens)
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
            continuation=continued,
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
        uses, waiting = list(prior.uses), tools.pending(prior.steps) if steps else []
        if steps and prior.steps:  # taken over between steps: the tools as a later step has them
            request = steps.next_request(request, messages, 0)
        outcome = step = None
        failure: tuple[str, str] | None = None
        while True:
            if (
                steps and waiting
            ):  # the calls the answer asked for, then generation with their results
                made = await steps.call(waiting, flight.stop)
                if made is None:  # cancelled (or handed off) while its tools ran
                    outcome = replace(outcome or Outcome(), finish_reason="cancelled")
                    break
                for use in made:
                    seq += 1
                    spent = prior.tokens + (outcome.completion_tokens if outcome else 0)
                    await self._publish_delta(
                        run, delta(run, seq, "delta", tool_result=use, tokens=spent)
                    )
                uses += made
                said = "".join(step.text) if step else ""
                request = steps.next_request(
                    request,
                    [*request.messages, *tools.exchange(waiting, said, made)],
                    step.completion_tokens if step else 0,
                )
                if request.max_tokens <= 0:
                    break
            base = prior.tokens + (outcome.completion_tokens if outcome else 0)
            step, failure, seq, handed = await self.steps.generate(
                flight.run, flight.stop, request, guard, coalescer, seq, base, timing
            )
            flight.handing_off = flight.handing_off or handed
            outcome = tools.merged(outcome, step)
            waiting = step.tool_calls if step and steps else []
            if not waiting or failure or flight.handing_off or flight.stop.is_set():
                break
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
            uses=uses,
        )

    def _tool_steps(self, run: RunScheduled, prior: Prior) -> tools.ToolSteps | None:
        """The run's calls to registered tools, when its edge offered it some (None otherwise)."""
        generation = run["prompt"].get("generation")
        if self.tool_servers is None or generation is None or not tools.server_tools(generation):
            return None
        limit = self.settings.max_tool_calls
        guard = ContextGuard(self.moderator, self.policies) if self.moderator else None
        tier, run_id = run["prompt"]["tier"], run["prompt"]["run_id"]
        return tools.ToolSteps(
            self.tool_servers, guard, limit, generation, tier, run_id, len(prior.uses)
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
        uses: list[ToolUse] | None = None,
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
        done = {**done, "tools": uses or list(prior.uses)}
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
        done = {**done, "tools": prior.uses}
        await self.producer.publish(RUN_COMPLETED, done, key=run["prompt"]["chat_id"])
        return done
