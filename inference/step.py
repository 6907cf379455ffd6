"""One engine request of a run: its text published as it comes (coalesced, checked by the output guard beside),
its tool calls published whole at its end. A run is one such step, or several when it calls registered tools
(inference/tools.py, inference/run.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable

from inference.coalesce import Coalescer
from inference.completion import Timing
from inference.engine import Engine, EngineDown, Outcome, Request, generate
from inference.metrics import INTER_TOKEN
from inference.settings import InferenceSettings
from safety.output import OutputGuard
from topics.events import RunScheduled, TokenDelta
from topics.records import token_delta as delta

log = logging.getLogger(__name__)


class Steps:
    def __init__(
        self,
        settings: InferenceSettings,
        engine: Engine,
        send_delta: Callable[[RunScheduled, TokenDelta], Awaitable[None]],
        engine_down: Callable[[], None],
    ) -> None:
        self.settings, self.engine, self.send_delta, self.engine_down = (
            settings,
            engine,
            send_delta,
            engine_down,
        )

    async def generate(
        self,
        run: RunScheduled,
        stop: asyncio.Event,
        request: Request,
        guard: OutputGuard | None,
        coalescer: Coalescer,
        seq: int,
        base: int,
        timing: Timing,
    ) -> tuple[Outcome | None, tuple[str, str] | None, int, bool]:
        """One engine request of the run: (its outcome, a failure, the last seq, whether the engine failed under
        it: the run is handed off). base: the run's completion tokens before it."""
        pool, forced, handing_off = self.settings.pool, request.forced_calls, False
        prompt = run["prompt"]
        last_emit: float | None = None
        last_record = time.perf_counter()
        last_piece: float | None = None
        outcome: Outcome | None = None
        failure: tuple[str, str] | None = None
        try:
            async for piece, progress in generate(
                self.engine, request, stop, heartbeat_s=self.settings.keepalive_s or None
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
                    guard.feed(piece, base + progress.pieces)
                ready = coalescer.add(piece)
                if (
                    ready or arrived - last_record >= self.settings.keepalive_s
                ):  # text, or a keepalive (prefill)
                    seq += 1
                    tokens = base + progress.completion_tokens
                    await self.send_delta(
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
            handing_off = True
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
            tokens = base + (outcome.completion_tokens if outcome else 0)
            await self.send_delta(run, delta(run, seq, "delta", text=rest, tokens=tokens))
        if outcome is not None and outcome.tool_calls and not handing_off:
            seq += 1
            made = json.dumps(outcome.tool_calls)
            tokens = base + outcome.completion_tokens
            await self.send_delta(run, delta(run, seq, "delta", tool_calls=made, tokens=tokens))
        return outcome, failure, seq, handing_off
