"""PromptModerated -> RunScheduled (+ a `queued` record on the run's reply partition) | RunRejected.

Blocked prompts are rejected; allowed ones get their context and a model pool. The context is assembled
within the pool's token budget, counted with the serving model's tokenizer (conversation/context.py,
docs/decisions/0008-conversation-memory.md): system prompt and the chat's rolling summary, the turns after
it verbatim, the older messages most similar to the new one (retrieved from Cassandra's vector index), then
the new message; what went in is recorded on the RunScheduled event. The pool is the requested model's, or
the next larger one whose budget holds the message. Then admission (docs/decisions/0006-admission-control.md):
- bounded queues: a run whose estimated wait in its pool exceeds its tier's bound is moved to a smaller pool
  (tiers that may degrade) or rejected at once with a Retry-After;
- budgets: its cost (prompt tokens + max_tokens) is charged to the user's token bucket in the ledger, which
  also holds the user's runs in flight; RunCompleted settles the charge with the actual usage.
The edge answers 429 (or 400) before its stream starts on a rejection, and starts streaming on `queued`.
Text the system itself puts into the prompt (earlier answers, the summary, retrieved messages) is screened
for prompt injection under the tier's policy: a flagged item is replaced by a notice (ContextGuard).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from admission.limits import Limits, LimitsView
from admission.placement import (
    EngineLoad,
    Placement,
    PoolView,
    capacity_message,
    home_partition,
    place,
)
from conversation.context import TooLong
from conversation.gather import ContextGuard, assemble_chat_run, assemble_given
from processors.settings import ProcessorSettings
from processors.stage import Handler, Publish, Stage, on
from runtime.reply_log import published
from safety.guard_model import moderator_for
from safety.policy import PolicyView
from storage import schema
from storage.conversations import Conversations
from storage.documents import Documents
from storage.ledger import Decision, Ledger
from storage.memories import Memories
from storage.memory import Memory
from storage.withdrawals import TAKEN, WITHDRAWN, ids, suspect
from topics.clock import now_ms
from topics.events import (
    PromptAccepted,
    PromptModerated,
    RunCompleted,
    RunRejected,
    RunScheduled,
    TokenDelta,
)
from topics.pipeline import (
    PROMPT_MODERATED,
    RUN_COMPLETED,
    RUN_REJECTED,
    RUN_SCHEDULED,
    TOKEN_DELTA,
    named,
)
from topics.records import cited_sources, recalled_memories, token_delta

log = logging.getLogger(__name__)


ADMISSION = Counter(
    "parley_scheduler_admissions_total", "Admission decisions", ["tier", "pool", "outcome"]
)  # outcome: admitted | degraded | over_capacity | token_budget_exceeded | concurrency_limit_exceeded | ...
SETTLED = Counter(
    "parley_scheduler_settled_total",
    "Runs whose charge was settled with the actual usage",
    ["outcome"],
)


def reject(
    prompt: PromptAccepted,
    code: str,
    message: str,
    category: str | None = None,
    retry_after_s: int | None = None,
) -> RunRejected:
    return {
        "event_id": str(uuid.uuid4()),
        "prompt": prompt,
        "code": code,
        "message": message,
        "category": category,
        "retry_after_s": retry_after_s,
        "rejected_at": now_ms(),
    }


def queued(run: RunScheduled, wait_s: float) -> TokenDelta:
    """The reply record that tells the edge the run was admitted (seq -1: before the consumer's `started`)."""
    return token_delta(
        run,
        -1,
        "queued",
        model=run["model"],
        pool=run["pool"],
        estimated_wait_ms=int(wait_s * 1000),
        degraded_from=run.get("degraded_from"),
        memories=recalled_memories(run),
        sources=cited_sources(run),
    )


def smaller_pools(run: RunScheduled, settings: ProcessorSettings) -> list[str]:
    """Pools smaller than the run's that still hold it, largest first: where it may go under pressure (pure)."""
    mine = settings.pools[run["pool"]].context
    fits = [
        (p.context, name)
        for name, p in settings.pools.items()
        if run["estimate_tokens"] <= p.context < mine
    ]
    return [name for _, name in sorted(fits, reverse=True)]


@dataclass(frozen=True)
class Refusal:
    code: str
    message: str
    retry_after_s: int | None = None


def place_run(
    run: RunScheduled,
    before: Decision | None,
    tiers: dict[str, Limits],
    loads: dict[str, list[EngineLoad]],
    partitions: dict[str, int],
    settings: ProcessorSettings,
) -> tuple[RunScheduled, Placement] | Refusal:
    """Where an assembled run goes, and the run as it is scheduled there (pure: a new run, the given one is
    left as it was): its pool (a smaller one under pressure, for tiers that may degrade), the model of that
    pool, its tier's priority. A run the ledger admitted before a crash goes where it went the first time,
    whatever the load now, marked `rescheduled` (that copy's consumer must be the one to get this one, to
    recognise it). Refused when no pool can start it within its tier's bound."""
    prompt = run["prompt"]
    tier, chat_id = prompt["tier"], prompt["chat_id"]
    placement = place(
        run["pool"], smaller_pools(run, settings), loads, chat_id, tier, tiers, partitions
    )
    run = {**run, "priority": tiers[tier].priority}
    if before is not None:
        pool = before.pool if before.pool in partitions else run["pool"]
        partition = (
            before.partition
            if before.partition is not None
            else home_partition(chat_id, partitions[pool])
        )
        degraded_from = run["pool"] if pool != run["pool"] else None
        placement = Placement(pool, placement.wait_s, partition, degraded_from=degraded_from)
        run = {**run, "rescheduled": True}
    if placement.pool is None:
        return Refusal(
            "over_capacity",
            capacity_message(run["model"], placement.wait_s),
            placement.retry_after_s,
        )
    if placement.degraded_from:
        model = settings.pools[placement.pool].model
        run = {**run, "degraded_from": run["pool"], "pool": placement.pool, "model": model}
    return run, placement


@dataclass(frozen=True)
class Deps:
    publish: Publish
    crash_point: Callable[[str], None]  # tests: a process killed at a named point
    settings: ProcessorSettings
    conversations: Conversations
    ledger: Ledger
    limits: LimitsView
    pools: PoolView
    context: ContextGuard
    memory: Memory
    memories: Memories  # a person's memories across chats (read only)
    documents: Documents  # a chat's documents, as the memory stage read them (read only)


async def refuse(prompt: PromptAccepted, code: str, message: str, deps: Deps, **extra: Any) -> None:
    ADMISSION.labels(prompt["tier"], "", code).inc()
    log.info(
        "run %s of %s (%s) rejected: %s: %s",
        prompt["run_id"],
        prompt["user_id"],
        prompt["tier"],
        code,
        message,
    )
    await deps.publish(
        RUN_REJECTED, reject(prompt, code, message, **extra), partition=prompt["reply_partition"]
    )


async def told_queued(prompt: PromptAccepted, since_ms: int, settings: ProcessorSettings) -> bool:
    """Whether the run's stream was already told it is queued (a run scheduled again after a crash): a
    second `queued` record would reach the client in the middle of its answer."""
    records = await asyncio.get_running_loop().run_in_executor(
        None,
        published,
        settings.kafka_bootstrap,
        named(TOKEN_DELTA, settings.namespace),
        prompt["reply_partition"],
        prompt["run_id"],
        since_ms,
        settings.group("scheduling.replies"),
    )
    return any(r["kind"] == "queued" for r in records)


async def on_moderated(moderated: PromptModerated, deps: Deps) -> None:
    prompt = moderated["prompt"]
    if (
        suspect(prompt, now_ms())
        and await deps.conversations.settle_fate(*ids(prompt), TAKEN) != TAKEN
    ):
        # the edge gave up on it first and answered 503 (storage/withdrawals.py): nothing of it is served
        await refuse(
            prompt, WITHDRAWN, "The request was refused when it was sent; it is not served.", deps
        )
        return
    if moderated["decision"] == "blocked":
        category = moderated["category"]
        await refuse(
            prompt,
            "content_filter",
            "This request was declined by the content policy.",
            deps,
            category=category,
        )
        return
    try:
        if prompt.get("messages"):
            run = assemble_given(prompt, deps.settings)
        else:
            run = await assemble_chat_run(
                prompt,
                deps.conversations,
                deps.memory,
                deps.memories,
                deps.documents,
                deps.context,
                deps.settings,
            )
    except TooLong as exc:
        await refuse(prompt, "context_length_exceeded", str(exc), deps)
        return
    tier, user = prompt["tier"], prompt["user_id"]
    # Read after the assembly, which waits for the chat's previous turn: its run is settled by then, most
    # likely, and the account the first compare-and-set decides on is as fresh as it can be.
    account, before = await deps.ledger.look(user, prompt["run_id"])
    if before is not None and before.scheduled:
        log.info(
            "run %s was scheduled before (a redelivered prompt): nothing to do", prompt["run_id"]
        )
        return
    tiers = deps.limits.tiers_for(user, tier)
    placed = place_run(run, before, tiers, deps.pools.loads(), deps.pools.partitions, deps.settings)
    if isinstance(placed, Refusal):
        await refuse(prompt, placed.code, placed.message, deps, retry_after_s=placed.retry_after_s)
        return
    run, placement = placed
    assert placement.pool is not None  # a placement without a pool is a Refusal
    decision = await deps.ledger.admit(
        user,
        prompt["run_id"],
        run["estimate_tokens"],
        tiers[tier],
        placement.pool,
        placement.partition,
        account if before is None else None,
    )
    if not decision.admitted:
        await refuse(
            prompt, decision.code, decision.message, deps, retry_after_s=decision.retry_after_s
        )
        return
    # admitted now (assembly and the deps.ledger's wait came before), or when it was admitted before a crash
    run = {**run, "scheduled_at": (before and before.decided_at) or now_ms()}
    deps.pools.admitted(prompt["run_id"], run["pool"], tier, placement.partition)
    ADMISSION.labels(tier, run["pool"], "degraded" if run["degraded_from"] else "admitted").inc()
    tell = before is None or not await told_queued(prompt, run["scheduled_at"], deps.settings)
    scheduled = deps.publish(
        RUN_SCHEDULED[run["pool"]], run, key=prompt["chat_id"], partition=placement.partition
    )
    if tell:
        # Both at once: one wait for the broker's acks instead of two in a row. `queued` is sent first and
        # nearly always lands first; one that lands after the run's first record is still shown (api/streams.py).
        told = deps.publish(
            TOKEN_DELTA, queued(run, placement.wait_s), partition=prompt["reply_partition"]
        )
        await asyncio.gather(told, scheduled)
    else:
        await scheduled
    deps.crash_point(
        "scheduling-after-publish"
    )  # tests: the window a redelivered prompt must not reopen
    await deps.ledger.mark_scheduled(user, prompt["run_id"])


async def on_completed(done: RunCompleted, deps: Deps) -> None:
    """The run's charge becomes its actual usage (once: a redelivered completion changes nothing)."""
    prompt, usage = done["prompt"], done["usage"]
    actual = usage["prompt_tokens"] + usage["completion_tokens"]
    mine = deps.limits.for_user(prompt["user_id"], prompt["tier"])
    changed = await deps.ledger.settle(prompt["user_id"], prompt["run_id"], actual, mine)
    SETTLED.labels("settled" if changed else "unchanged").inc()
    if prompt.get("store", True) and not prompt.get("summary") and done["content"]:
        await deps.context.screen(
            prompt["run_id"], done["content"], prompt["tier"]
        )  # the next turn finds it cached


HANDLERS: list[Handler[Deps]] = [
    on(PROMPT_MODERATED, on_moderated),
    on(RUN_COMPLETED, on_completed),
]


def build(stage: Stage, settings: ProcessorSettings) -> None:
    session = schema.connect(settings.cassandra)
    keyspace, name = settings.keyspace_name, stage.name
    limits = LimitsView(settings.kafka_bootstrap, settings.namespace, name)
    pools = PoolView(settings.kafka_bootstrap, settings.namespace, name)
    policies = PolicyView(settings.kafka_bootstrap, settings.namespace, name)
    for view in (limits, pools, policies):
        view.start()
    deps = Deps(
        stage.publish,
        stage.crash_point,
        settings,
        Conversations(session, keyspace, name),
        Ledger(session, keyspace, name, settings.run_deadline_s),
        limits,
        pools,
        ContextGuard(moderator_for(settings), policies),
        Memory(session, keyspace, name),
        Memories(session, keyspace, name),
        Documents(session, keyspace, name),
    )
    stage.serve(HANDLERS, deps)
