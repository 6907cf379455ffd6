"""Scores and decisions: the shared encoder, the heads, the rules and a policy, for one stage's text.

Used by the moderation stage (prompts), the inference consumers (windows of the streamed answer) and the
scheduler (text the system itself puts into a prompt). The encoder runs in a worker thread (onnxruntime
releases the GIL), so an event loop never stalls on a check.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from prometheus_client import Counter, Histogram

from safety import heads as heads_mod
from safety import obfuscation
from safety.encoder import Encoder
from safety.policy import Decision, Policy, Stage, decide

log = logging.getLogger(__name__)

INTERVENTIONS = Counter(
    "parley_safety_interventions_total",
    "Moderation decisions that matched a rule",
    ["stage", "category", "action"],
)
ERRORS = Counter(
    "parley_safety_errors_total",
    "Classifier failures, by stage and how they failed",
    ["stage", "mode"],
)
CHECK = Histogram(
    "parley_safety_check_seconds",
    "Time to score one text (a prompt, an output window, a context segment)",
    ["stage"],
    buckets=(0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
# a prompt is read in up to this many 256-token windows (the first ones and the last)
INPUT_WINDOWS = 16


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    scores: dict[str, float]
    policy_version: str
    check_ms: float
    error: str | None = None

    @property
    def blocked(self) -> bool:
        return self.decision.blocked


def read(texts: Sequence[str], plain: bool) -> list[str]:
    """What a check scores of some texts: each one that is not blank and, with `plain`, its plain readings."""
    present = [t for t in texts if t and t.strip()]
    if plain:
        present += [r for t in present for r in obfuscation.readings(t) if r.strip()]
    return present


def with_rules(
    scores: dict[str, float], texts: Sequence[str], categories: Sequence[str]
) -> dict[str, float]:
    """The heads' scores, with every category a rule finds in one of the texts set to 1.0."""
    hits = {hit for text in texts for hit in heads_mod.rule_hits(text, tuple(categories))}
    return {**scores, **dict.fromkeys(hits, 1.0)}


class Turns:
    """Who runs a check next: at most `slots` at once, and an urgent check (one that holds something up: a
    prompt, a context, the last window of an answer, which holds the end of its stream) before every check
    waiting that is not (a window checked while its answer streams on, which holds nothing up). Under 64
    streams the queue of those is long (bench/output_check_load.py); the end of a stream never waits in it."""

    def __init__(self, slots: int) -> None:
        self.free = slots
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    @contextlib.asynccontextmanager
    async def turn(self, urgent: bool) -> AsyncIterator[None]:
        if self.free > 0 and not self._waiting:
            self.free -= 1
        else:
            called: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting, (0 if urgent else 1, next(self._order), called))
            try:
                await called
            except asyncio.CancelledError:
                if called.done() and not called.cancelled():  # handed the turn as it was cancelled
                    self._next()
                raise
        try:
            yield
        finally:
            self._next()

    def _next(self) -> None:
        while self._waiting:
            _, _, called = heapq.heappop(self._waiting)
            if not called.done():
                called.set_result(None)
                return
        self.free += 1


class Moderator:
    def __init__(self, threads: int = 1, workers: int = 1) -> None:
        """`threads`: the encoder's threads within one check; `workers`: checks run at once (each on its own
        thread; the encoder's session runs them side by side)."""
        tasks = tuple(dict.fromkeys(heads_mod.INPUT_TASKS + heads_mod.OUTPUT_TASKS))
        self.heads = heads_mod.load(tasks)
        self.encoder = Encoder(threads=threads)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="safety")
        self._turns = Turns(workers)

    def scores(
        self, texts: Sequence[str], categories: Sequence[str], windows: int, plain: bool = False
    ) -> dict[str, float]:
        """Each category's highest score over the texts' windows (pure given the model; runs here). With
        `plain`, each text's plain readings (leetspeak undone, look-alike letters folded, encoded payloads
        decoded: safety/obfuscation.py) are scored too, so an obfuscated request scores as if written plainly."""
        present = read(texts, plain)
        if (
            not present or not categories
        ):  # nothing to read, or a policy with no rules here: no model call
            return {c: 0.0 for c in categories}
        embeddings = np.concatenate([self.encoder.windows(t, windows) for t in present])
        scores = {c: self.heads[c].score(embeddings) for c in categories if c in self.heads}
        return with_rules(scores, present, categories)

    def check(
        self, policy: Policy, stage: Stage, texts: Sequence[str], windows: int = INPUT_WINDOWS
    ) -> Verdict:
        """Score the texts for the stage's categories and apply the policy. A classifier failure is decided
        by the policy's on_error: open lets the text through, closed blocks it; both are recorded."""
        started = time.perf_counter()
        categories = policy.categories(stage)
        try:
            # Obfuscation is an attacker's move: prompts and context are read plainly too; the answers the model
            # writes are not (their numbers and codes would cost an encoder pass for nothing).
            scores = self.scores(texts, categories, windows, plain=stage != "output")
            decision = decide(policy, stage, scores)
            error = None
        except Exception as exc:
            log.exception(
                "%s moderation failed; failing %s per policy %s",
                stage,
                policy.on_error,
                policy.version,
            )
            ERRORS.labels(stage, policy.on_error).inc()
            scores = {}
            error = f"{type(exc).__name__}: {exc} (failed {policy.on_error})"
            blocked = policy.on_error == "closed"
            decision = Decision(
                "block" if blocked else None, "classifier_error" if blocked else None, None
            )
        elapsed = time.perf_counter() - started
        CHECK.labels(stage).observe(elapsed)
        if decision.action:
            INTERVENTIONS.labels(stage, decision.category, decision.action).inc()
        return Verdict(decision, scores, policy.version, elapsed * 1000, error)

    async def check_async(
        self,
        policy: Policy,
        stage: Stage,
        texts: Sequence[str],
        windows: int = INPUT_WINDOWS,
        urgent: bool = True,
    ) -> Verdict:
        """`check` in a worker thread, in its turn (`Turns`)."""
        loop = asyncio.get_running_loop()
        async with self._turns.turn(urgent):
            return await loop.run_in_executor(self._pool, self.check, policy, stage, texts, windows)
