"""PromptModerated -> RunScheduled (+ a `queued` record on the run's reply partition) | RunRejected.

Blocked prompts are rejected; allowed ones get their context (system prompt + the chat's recent turns + the
new message) and a model pool: the one serving the requested model, or the smallest whose context holds the
prompt and its answer. Then admission (docs/decisions/0006-admission-control.md):
- bounded queues: a run whose estimated wait in its pool exceeds its tier's bound is moved to a smaller pool
  (tiers that may degrade) or rejected at once with a Retry-After;
- budgets: its cost (prompt estimate + max_tokens) is charged to the user's token bucket in the ledger, which
  also holds the user's runs in flight; RunCompleted settles the charge with the actual usage.
The edge answers 429 (or 400) before its stream starts on a rejection, and starts streaming on `queued`.
Text the system itself puts into the prompt (earlier answers now; summaries and retrieved memory later) is
screened for prompt injection under the tier's policy: a flagged turn is replaced by a notice (ContextGuard).
Summaries and retrieval are issue 7.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from prometheus_client import Counter

from processors.settings import ProcessorSettings
from processors.stage import Stage
from safety.moderator import Moderator
from safety.policy import PolicyView
from storage.cassandra import Conversations, Message
from storage.ledger import Ledger
from topics.admission import Placement, PoolView, capacity_message, estimate_tokens, home_partition, place
from topics.codec import Event, token_delta
from topics.limits import LimitsView
from topics.pipeline import PROMPT_MODERATED, RUN_COMPLETED, RUN_REJECTED, RUN_SCHEDULED, TOKEN_DELTA

log = logging.getLogger(__name__)


ADMISSION = Counter(
    "parley_scheduler_admissions_total", "Admission decisions", ["tier", "pool", "outcome"]
)  # outcome: admitted | degraded | over_capacity | token_budget_exceeded | concurrency_limit_exceeded | ...
SETTLED = Counter("parley_scheduler_settled_total", "Runs whose charge was settled with the actual usage", ["outcome"])


def reject(
    prompt: Event, code: str, message: str, category: str | None = None, retry_after_s: int | None = None
) -> Event:
    return {
        "event_id": str(uuid.uuid4()),
        "prompt": prompt,
        "code": code,
        "message": message,
        "category": category,
        "retry_after_s": retry_after_s,
        "rejected_at": int(time.time() * 1000),
    }


def queued(run: Event, wait_s: float) -> Event:
    """The reply record that tells the edge the run was admitted (seq -1: before the consumer's `started`)."""
    return token_delta(
        run,
        -1,
        "queued",
        model=run["model"],
        pool=run["pool"],
        estimated_wait_ms=int(wait_s * 1000),
        degraded_from=run.get("degraded_from"),
    )


class TooLong(Exception):
    pass


def choose_pool(prompt: Event, messages: list[dict[str, str]], settings: ProcessorSettings) -> tuple[str, str]:
    """(pool, model) for a run (pure). A requested model picks its pool; a prompt that does not fit there
    goes to the smallest pool whose context holds it (the answer names the model that served it)."""
    need = estimate_tokens(messages) + prompt["max_tokens"]
    by_size = sorted(settings.pools.items(), key=lambda item: item[1].context)
    wanted = prompt["model"] or settings.pools[settings.default_pool].model
    for name, pool in by_size:
        if pool.model == wanted and need <= pool.context:
            return name, pool.model
    for name, pool in by_size:
        if need <= pool.context:
            return name, pool.model
    largest = by_size[-1][1].context
    raise TooLong(
        f"This conversation needs about {need} tokens with its answer; the largest model here holds {largest}. "
        "Start a new chat or ask for a shorter answer."
    )


def assemble(prompt: Event, history: list[Message], settings: ProcessorSettings) -> Event:
    """The run to schedule (pure): the history is the chat's turns before this message, oldest first.

    A prompt from the OpenAI-compatible route carries its whole conversation and is used as sent.
    Raises TooLong when no pool can hold it.
    """
    if prompt.get("messages"):
        messages = [dict(m) for m in prompt["messages"]]
        earlier: list[Any] = messages[:-1]
    else:
        earlier = [m for m in history if m.id != prompt["message_id"] and m.content]
        earlier = earlier[-settings.context_messages :]
        messages = [{"role": "system", "content": settings.system_prompt}]
        messages += [{"role": m.role, "content": m.content} for m in earlier]
        messages.append({"role": "user", "content": prompt["content"]})
    pool, model = choose_pool(prompt, messages, settings)
    return {
        "event_id": str(uuid.uuid4()),
        "prompt": prompt,
        "pool": pool,
        "model": model,
        "messages": messages,
        "context_turns": len(earlier),
        "priority": 0,
        "degraded_from": None,
        "estimate_tokens": estimate_tokens(messages) + prompt["max_tokens"],
        "scheduled_at": int(time.time() * 1000),
    }


def smaller_pools(run: Event, settings: ProcessorSettings) -> list[str]:
    """Pools smaller than the run's that still hold it, largest first: where it may go under pressure (pure)."""
    mine = settings.pools[run["pool"]].context
    fits = [(p.context, name) for name, p in settings.pools.items() if run["estimate_tokens"] <= p.context < mine]
    return [name for _, name in sorted(fits, reverse=True)]


async def history_for(prompt: Event, conversations: Conversations, settings: ProcessorSettings) -> list[Message]:
    """The chat's turns before this message. Waits (bounded) until the previous answer is persisted."""
    if not prompt["prev_run_id"]:
        return []  # the chat's first turn: nothing earlier to read (saves a query on the path to the first token)
    chat_id = uuid.UUID(prompt["chat_id"])
    deadline = time.monotonic() + settings.prev_turn_wait_s
    while not await conversations.has_message(chat_id, uuid.UUID(prompt["prev_run_id"])):
        if time.monotonic() > deadline:
            log.warning(
                "chat %s: previous answer %s not persisted after %.1fs; scheduling without it",
                prompt["chat_id"],
                prompt["prev_run_id"],
                settings.prev_turn_wait_s,
            )
            break
        await asyncio.sleep(0.05)
    recent = await conversations.recent_messages(chat_id, settings.context_messages + 2)
    before = uuid.UUID(prompt["message_id"]).time
    return [m for m in recent if uuid.UUID(m.id).time < before]


WITHHELD = (
    "[An earlier answer was withheld from this context: it contained text that reads as instructions to the assistant.]"
)


class ContextGuard:
    """Screens earlier answers before they go back into a prompt. A verdict is cached by message id (an
    answer is screened once, when it completes, off the path to the next first token)."""

    def __init__(self, moderator: Moderator, policies: PolicyView, size: int = 10_000) -> None:
        self.moderator = moderator
        self.policies = policies
        self.size = size
        self._flagged: OrderedDict[str, bool] = OrderedDict()

    async def screen(self, message_id: str, text: str, tier: str) -> bool:
        """True when the text must not go into a prompt."""
        if message_id in self._flagged:
            self._flagged.move_to_end(message_id)
            return self._flagged[message_id]
        verdict = await self.moderator.check_async(self.policies.for_tier(tier), "context", [text])
        if verdict.blocked:
            log.info("context: message %s withheld (%s %.2f)", message_id, verdict.decision.category,
                     verdict.decision.score or 0.0)  # fmt: skip
        self._flagged[message_id] = verdict.blocked
        while len(self._flagged) > self.size:
            self._flagged.popitem(last=False)
        return verdict.blocked

    async def history(self, history: list[Message], tier: str) -> list[Message]:
        """The history with every flagged assistant turn replaced by a notice (user turns were moderated as input)."""
        out = []
        for m in history:
            if m.role == "assistant" and m.content and await self.screen(m.id, m.content, tier):
                m = replace(m, content=WITHHELD)
            out.append(m)
        return out


def register(
    stage: Stage,
    conversations: Conversations,
    ledger: Ledger,
    limits: LimitsView,
    pools: PoolView,
    context: ContextGuard,
) -> None:
    settings = stage.settings

    async def refuse(prompt: Event, code: str, message: str, **extra: Any) -> None:
        ADMISSION.labels(prompt["tier"], "", code).inc()
        log.info(
            "run %s of %s (%s) rejected: %s: %s", prompt["run_id"], prompt["user_id"], prompt["tier"], code, message
        )
        await stage.publish(RUN_REJECTED, reject(prompt, code, message, **extra), partition=prompt["reply_partition"])

    async def handle(moderated: Event) -> None:
        prompt = moderated["prompt"]
        if moderated["decision"] == "blocked":
            category = moderated["category"]
            await refuse(
                prompt, "content_filter", "This request was declined by the content policy.", category=category
            )
            return
        history = [] if prompt.get("messages") else await history_for(prompt, conversations, settings)
        history = await context.history(history, prompt["tier"])
        try:
            run = assemble(prompt, history, settings)
        except TooLong as exc:
            await refuse(prompt, "context_length_exceeded", str(exc))
            return
        tier, user = prompt["tier"], prompt["user_id"]
        before = await ledger.decided(user, prompt["run_id"])
        if before is not None and before.scheduled:
            log.info("run %s was scheduled before (a redelivered prompt): nothing to do", prompt["run_id"])
            return
        tiers = limits.tiers_for(user, tier)
        mine = tiers[tier]
        chat_id = prompt["chat_id"]
        placement = place(run["pool"], smaller_pools(run, settings), pools.loads(), chat_id, tier, tiers)
        if before is not None:  # admitted (and charged) before a crash: schedule it whatever the load now
            placement = Placement(run["pool"], placement.wait_s, home_partition(run["pool"], chat_id))
        if placement.pool is None:
            message = capacity_message(run["model"], placement.wait_s)
            await refuse(prompt, "over_capacity", message, retry_after_s=placement.retry_after_s)
            return
        if placement.degraded_from:
            run["degraded_from"], run["pool"] = run["pool"], placement.pool
            run["model"] = settings.pools[placement.pool].model
        run["priority"] = mine.priority
        decision = await ledger.admit(user, prompt["run_id"], run["estimate_tokens"], mine)
        if not decision.admitted:
            await refuse(prompt, decision.code, decision.message, retry_after_s=decision.retry_after_s)
            return
        pools.admitted(prompt["run_id"], run["pool"], tier, placement.partition)
        ADMISSION.labels(tier, run["pool"], "degraded" if run["degraded_from"] else "admitted").inc()
        await stage.publish(TOKEN_DELTA, queued(run, placement.wait_s), partition=prompt["reply_partition"])
        await stage.publish(RUN_SCHEDULED[run["pool"]], run, key=chat_id, partition=placement.partition)
        await ledger.mark_scheduled(user, prompt["run_id"])

    async def settle(done: Event) -> None:
        """The run's charge becomes its actual usage (once: a redelivered completion changes nothing)."""
        prompt, usage = done["prompt"], done["usage"]
        actual = usage["prompt_tokens"] + usage["completion_tokens"]
        mine = limits.for_user(prompt["user_id"], prompt["tier"])
        changed = await ledger.settle(prompt["user_id"], prompt["run_id"], actual, mine)
        SETTLED.labels("settled" if changed else "unchanged").inc()
        if prompt.get("store", True) and done["content"]:  # screened now, so the next turn finds the verdict cached
            await context.screen(prompt["run_id"], done["content"], prompt["tier"])

    stage.consume(PROMPT_MODERATED, handle)
    stage.consume(RUN_COMPLETED, settle)
