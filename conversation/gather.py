"""A run's context, gathered for the scheduler: the chat's rolling summary, its recent turns verbatim and the
older messages most similar to the new one (Cassandra and its vector index), each assistant-written item
screened for prompt injection (ContextGuard), fitted by conversation/context.py into the first pool whose
budget holds it (docs/decisions/0008-conversation-memory.md). A prompt that carries its whole conversation
(the OpenAI-compatible route) is used as sent."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import replace
from typing import cast

import numpy as np
from prometheus_client import Histogram

from conversation import tokens
from conversation.context import Assembled, Limits, TooLong, Turn, assemble_chat, relevant
from conversation.memories import Recalled as RecalledMemories
from conversation.memories import embedded, recall_memories
from conversation.settings import ContextSettings
from conversation.sources import cited_passages
from runtime.settings import Pool
from safety.moderator import Moderator
from safety.policy import PolicyView
from storage.conversations import Conversations
from storage.documents import Documents
from storage.ids import MIN_ID
from storage.memories import Memories
from storage.memory import Memory, Recalled, Summary
from storage.rows import Change, Message
from storage.tree import before
from topics.clock import now_ms
from topics.events import PromptAccepted, PromptContext, RunScheduled

log = logging.getLogger(__name__)

PROMPT_TOKENS = Histogram(
    "parley_scheduler_prompt_tokens",
    "Assembled prompt tokens",
    ["pool"],
    buckets=(64, 256, 512, 1024, 1536, 2048, 4096, 8192),
)
RECALLED = Histogram(
    "parley_scheduler_recalled_messages",
    "Older messages retrieved into a prompt",
    buckets=(0, 1, 2, 3, 4, 8),
)


def limits_for(pool: Pool, max_tokens: int, settings: ContextSettings) -> Limits:
    """The prompt budget in a pool: its own, less whatever the answer needs beyond the rest of the context."""
    return Limits(
        budget=min(pool.budget, pool.context - max_tokens),
        summary_tokens=settings.summary_tokens,
        recall_tokens=settings.recall_tokens,
        recall_item_tokens=settings.recall_item_tokens,
    )


def pools_in_order(prompt: PromptAccepted, settings: ContextSettings) -> list[str]:
    """Where a run may go, in order: the requested model's pool (or the default pool), then the others from
    the smallest context up (a prompt that does not fit goes to the smallest pool that holds it)."""
    wanted = prompt["model"] or settings.pools[settings.default_pool].model
    by_size = sorted(settings.pools, key=lambda name: settings.pools[name].context)
    first = [name for name in by_size if settings.pools[name].model == wanted][:1]
    return first + [name for name in by_size if name not in first]


def scheduled(
    prompt: PromptAccepted, pool: str, settings: ContextSettings, assembled: Assembled, turns: int
) -> RunScheduled:
    return {
        "event_id": str(uuid.uuid4()),
        "prompt": prompt,
        "pool": pool,
        "model": settings.pools[pool].model,
        "messages": assembled.messages,
        "context_turns": turns,
        "priority": 0,
        "degraded_from": None,
        "estimate_tokens": assembled.record["prompt_tokens"] + prompt["max_tokens"],
        "context": cast(
            PromptContext, assembled.record
        ),  # built up by the assembly (conversation/context.py)
        "rescheduled": False,
        "scheduled_at": now_ms(),
    }


def assemble_given(prompt: PromptAccepted, settings: ContextSettings) -> RunScheduled:
    """The run for a prompt that carries its whole conversation (the OpenAI-compatible route), used as sent:
    the first pool in order whose budget holds it, counted with that pool's tokenizer. Raises TooLong."""
    messages = list(prompt.get("messages") or [])
    generation = prompt.get("generation")
    tools = generation.get("tools") if generation else None  # described in the system turn
    need = 0
    for name in pools_in_order(prompt, settings):
        pool = settings.pools[name]
        counter = tokens.load(pool.tokenizer)
        need = counter.count_chat(messages) + (counter.count(tools) if tools else 0)
        if need + prompt["max_tokens"] <= pool.context:
            record = {"budget": pool.context - prompt["max_tokens"], "prompt_tokens": need}
            return scheduled(prompt, name, settings, Assembled(messages, record), len(messages) - 1)
    raise TooLong(
        f"This conversation needs {need} tokens with its answer; the largest model here holds "
        f"{max(p.context for p in settings.pools.values())}. Start a new chat or ask for a shorter answer."
    )


async def wait_for_previous(
    prompt: PromptAccepted, conversations: Conversations, settings: ContextSettings
) -> None:
    """Wait (bounded) until the chat's previous answer is persisted, so the context includes it."""
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
            return
        await asyncio.sleep(0.05)


WITHHELD = (
    "[Withheld from this context: it contained text that reads as instructions to the assistant.]"
)


class ContextGuard:
    """Screens what the system itself puts into a prompt: earlier answers (verbatim or recalled) and the
    rolling summary (the user's own messages were moderated as input). A verdict is cached
    by id and text (an answer is screened once, when it completes, off the path to the next first token)."""

    def __init__(self, moderator: Moderator, policies: PolicyView, size: int = 10_000) -> None:
        self.moderator = moderator
        self.policies = policies
        self.size = size
        self._flagged: OrderedDict[tuple[str, int], bool] = OrderedDict()

    async def screen(self, item_id: str, text: str, tier: str) -> bool:
        """True when the text must not go into a prompt."""
        key = (item_id, hash(text))
        if key in self._flagged:
            self._flagged.move_to_end(key)
            return self._flagged[key]
        verdict = await self.moderator.check_async(self.policies.for_tier(tier), "context", [text])
        if verdict.blocked:
            log.info("context: %s withheld (%s %.2f)", item_id, verdict.decision.category,
                     verdict.decision.score or 0.0)  # fmt: skip
        self._flagged[key] = verdict.blocked
        while len(self._flagged) > self.size:
            self._flagged.popitem(last=False)
        return verdict.blocked

    async def turns(self, turns: list[Turn], tier: str) -> tuple[list[Turn], list[str]]:
        """The turns with each flagged assistant turn replaced by a notice, and the ids withheld. The user's
        own messages are not screened again: they were moderated as input, and a user who writes "remember
        this code" is stating a fact, not injecting instructions into someone else's prompt."""
        out, withheld = [], []
        for t in turns:
            if t.role == "assistant" and t.content and await self.screen(t.id, t.content, tier):
                t = replace(t, content=WITHHELD)
                withheld.append(t.id)
            out.append(t)
        return out, withheld


# the newest summaries read: one that an edit or a delete made wrong is passed over
SUMMARIES_READ = 3


def current_summary(summaries: list[Summary], changes: Mapping[str, Change]) -> Summary | None:
    """The newest summary no later edit or delete has made wrong (pure): one covering a changed message and
    written before the change is passed over until the memory stage, told of the change, drops it."""
    for summary in summaries:
        through = uuid.UUID(summary.through).time
        if not any(
            uuid.UUID(mid).time <= through
            and (summary.created_at is None or change.at > summary.created_at)
            for mid, change in changes.items()
        ):
            return summary
    return None


def as_changed(found: list[Recalled], changes: Mapping[str, Change]) -> list[Recalled]:
    """Recalled messages as the user left them (pure): a deleted one is not recalled, nor an edited one until
    the memory stage has embedded its new text."""
    return [r for r in found if r.id not in changes or changes[r.id].content == r.content]


def conversation_turns(rows: list[Message], before: int) -> list[Turn]:
    """The stored messages a prompt may carry (pure): those with text, earlier than the new message (a uuid1
    time), and answered. A question the pipeline turned away (refused by moderation, over capacity or budget)
    is left out together with its stored notice, which no model wrote: a retried question is not seen twice."""
    unanswered = {m.run_id for m in rows if m.role == "assistant" and m.model is None and m.run_id}
    return [
        Turn(m.id, m.role, m.content)
        for m in rows
        if m.content and uuid.UUID(m.id).time < before and m.run_id not in unanswered
    ]


INSTRUCTION_HEADERS = {
    "person": "\n\nThe person's own instructions for every chat:\n",
    "chat": "\n\nInstructions for this chat:\n",
}


async def with_instructions(
    prompt: PromptAccepted, guard: ContextGuard, settings: ContextSettings
) -> tuple[str, list[str], list[str]]:
    """The system prompt with the run's instructions (the person's, then the chat's) after it: (text, the
    sources in it, those the guard withheld as `instructions:SOURCE`). They are the person's own words, yet
    screened like any context a prompt carries: a prompt injection pasted into them goes no further."""
    system, sources, withheld = settings.system_prompt, [], []
    for item in prompt.get("instructions") or []:
        source = item["source"]
        flagged = await guard.screen(
            f"instructions:{source}:{prompt['chat_id']}", item["content"], prompt["tier"]
        )
        if flagged:
            withheld.append(f"instructions:{source}")
            continue
        system += INSTRUCTION_HEADERS.get(source, "\n\n") + item["content"]
        sources.append(source)
    return system, sources, withheld


async def branch_of(prompt: PromptAccepted, conversations: Conversations) -> set[str] | None:
    """The ids of the messages before this one on its branch of the chat's tree (storage/tree.py); None while
    the chat has one branch, and for a record written before the tree (the chat's messages in time order)."""
    parent = prompt.get("parent_id")
    if not parent or not prompt.get("branched"):  # one branch: every earlier message is on it
        return None
    return before(await conversations.skeleton(uuid.UUID(prompt["chat_id"])), parent)


async def person_memories(
    prompt: PromptAccepted, store: Memories, guard: ContextGuard, settings: ContextSettings
) -> tuple[np.ndarray | None, RecalledMemories]:
    """(the new message's embedding, when it was needed, and the sender's memories recalled for it)."""
    if not prompt.get("memories"):
        return None, RecalledMemories()
    query = await embedded(guard, prompt["content"])
    counter = tokens.load(settings.pools[pools_in_order(prompt, settings)[0]].tokenizer)
    return query, await recall_memories(prompt, store, guard, query, counter, settings)


async def assemble_chat_run(
    prompt: PromptAccepted,
    conversations: Conversations,
    memory: Memory,
    memories: Memories,
    documents: Documents,
    guard: ContextGuard,
    settings: ContextSettings,
) -> RunScheduled:
    """The run for a chat message: system prompt (with instructions and the sender's memories) + summary +
    verbatim window + recalled messages + the new message, fitted into the first pool whose budget holds it
    (conversation/context.py). Raises TooLong."""
    chat_id, tier = uuid.UUID(prompt["chat_id"]), prompt["tier"]
    summary, earlier, older, reset = None, [], False, None
    on_branch: set[str] | None = None
    recalling = asyncio.create_task(person_memories(prompt, memories, guard, settings))
    instructed_system, instructed, withheld = await with_instructions(prompt, guard, settings)
    if prompt[
        "prev_run_id"
    ]:  # not the chat's first turn (its first turn reads nothing: faster first token)
        await wait_for_previous(prompt, conversations, settings)
        chat, summaries, changes, on_branch = await asyncio.gather(
            conversations.get_chat(chat_id),
            memory.summaries(chat_id, SUMMARIES_READ),
            conversations.changes(chat_id),
            branch_of(prompt, conversations),
        )
        if on_branch is not None:  # another branch's summary does not hold for this one
            summaries = [s for s in summaries if s.through in on_branch]
        latest = current_summary(summaries, changes)
        reset = chat.context_from if chat is not None else None
        after = reset
        if latest is not None and not (reset and uuid.UUID(latest.through).time < reset.time):
            # A withheld summary's turns stay out of the window too (recall still reaches them): the window's
            # start, and so the cached prefix, does not depend on what the guard says.
            if await guard.screen(f"summary:{chat_id}:{latest.version}", latest.content, tier):
                withheld.append(f"summary:{latest.version}")
            else:
                summary = (latest.version, latest.through, latest.content)
            older, after = True, uuid.UUID(latest.through)
        rows = await conversations.messages_after(chat_id, after, settings.recent_messages, changes)
        if on_branch is not None:
            rows = [m for m in rows if m.id in on_branch]
        older = older or len(rows) >= settings.recent_messages
        before = uuid.UUID(prompt["message_id"]).time
        earlier = conversation_turns(rows, before)
        earlier, flagged = await guard.turns(earlier, tier)
        withheld += flagged
    query, remembered = await recalling
    first_counter = tokens.load(settings.pools[pools_in_order(prompt, settings)[0]].tokenizer)
    cited = await cited_passages(prompt, documents, guard, query, first_counter, settings)
    remembered_system = remembered.system(instructed_system)
    system = cited.system(remembered_system)
    withheld += remembered.withheld + cited.withheld
    refused: TooLong | None = None
    chosen: tuple[str, Limits, Assembled] | None = None
    args = (system, summary, earlier, older)
    for name in pools_in_order(prompt, settings):
        # The requested model's pool; otherwise the first (default, then smallest up) that keeps every turn
        # since the summary, or whose window only lets go of ordinary turns (aged out, recalled when relevant),
        # else the largest. A paste too long for a pool's window keeps the chat on a pool that holds it until
        # a summary folds it in; a long chat of ordinary turns stays on its pool.
        limits = limits_for(settings.pools[name], prompt["max_tokens"], settings)
        counter = tokens.load(settings.pools[name].tokenizer)
        try:
            draft = assemble_chat(*args, None, prompt["content"], limits, counter)
        except TooLong as exc:
            refused = exc
            continue
        if chosen is None or limits.budget > chosen[1].budget:
            chosen = (name, limits, draft)
        if prompt["model"] or draft.largest_dropped <= limits.budget // 2:
            chosen = (name, limits, draft)
            break
    if chosen is None:
        raise TooLong(f"{refused} Shorten it, or ask for a shorter answer.")
    name, limits, assembled = chosen
    kept = assembled.record["verbatim_ids"]
    if older or len(kept) < len(earlier):  # there is memory beyond the window: recall from it
        first = uuid.UUID(kept[0]) if kept else uuid.UUID(prompt["message_id"])
        if query is None:
            query = await embedded(guard, prompt["content"])
        recalled = await recall(
            memory, guard, chat_id, query, reset, first, tier, settings, changes, on_branch
        )
        withheld += [t.id for t in recalled if t.content == WITHHELD]
        counter = tokens.load(settings.pools[name].tokenizer)
        assembled = assemble_chat(*args, recalled, prompt["content"], limits, counter)
    assembled.record["withheld_ids"] = withheld
    assembled.record["instructions"] = instructed
    counter = tokens.load(settings.pools[name].tokenizer)
    base = counter.count(settings.system_prompt)
    assembled.record["instruction_tokens"] = (
        counter.count(instructed_system) - base if instructed else 0
    )
    assembled.record["memory_ids"] = [m.id for m in remembered.used]
    assembled.record["memories"] = [m.content for m in remembered.used]
    used = counter.count(remembered_system) - counter.count(instructed_system)
    assembled.record["memory_tokens"] = used if remembered.used else 0
    assembled.record["sources"] = cited.used
    assembled.record["document_tokens"] = counter.count(system) - counter.count(remembered_system)
    PROMPT_TOKENS.labels(name).observe(assembled.record["prompt_tokens"])
    return scheduled(prompt, name, settings, assembled, len(assembled.record["verbatim_ids"]))


async def recall(
    memory: Memory,
    guard: ContextGuard,
    chat_id: uuid.UUID,
    query: np.ndarray,
    after: uuid.UUID | None,
    before: uuid.UUID,
    tier: str,
    settings: ContextSettings,
    changes: Mapping[str, Change],
    on_branch: set[str] | None = None,
) -> list[Turn]:
    """The older messages to recall for the new one (best first, conversation/context.py `relevant`), with
    assistant messages screened (the user's own were moderated as they came in)."""
    found = await memory.recall(
        chat_id, query.tolist(), settings.recall_candidates, after or MIN_ID, before
    )
    found = as_changed(found, changes)
    if on_branch is not None:  # only this branch's messages (storage/tree.py)
        found = [r for r in found if r.id in on_branch]
    vectors = np.array([r.embedding for r in found], dtype=np.float32).reshape(len(found), -1)
    picked = relevant(
        query,
        [r.content for r in found],
        vectors,
        settings.recall_k,
        settings.recall_min_similarity,
        settings.recall_diversity,
    )
    RECALLED.observe(len(picked))
    screened, _ = await guard.turns(
        [Turn(found[i].id, found[i].role, found[i].content) for i in picked], tier
    )
    return screened
