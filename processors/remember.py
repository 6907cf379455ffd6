"""RunCompleted + MemoryChanged -> a chat's memory: embeddings in Cassandra, and rolling summaries.

After each stored turn, the user message and the answer are embedded with the shared MiniLM encoder and
written to the chat's vector index (retrieved later by the scheduler). When the turns after the chat's newest
summary pass `summarize_after_tokens`, the oldest of them (all but the newest `summarize_keep_tokens`) are
folded into a new summary version by a run on the small pool: a RunScheduled this stage publishes itself,
served like any run (lowest priority, store = false, metered), whose RunCompleted comes back here and is
stored as the next version. Nothing on the path of a reply waits for it: the scheduler uses whichever
summary is stored. Edits, deletes and resets (MemoryChanged, from the edge) re-embed, forget and summarise
again. Design: docs/decisions/0008-conversation-memory.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from admission.limits import BACKGROUND_PRIORITY
from admission.placement import home_partition
from conversation import tokens
from conversation.gather import branch_of
from conversation.summary import SUMMARY_OVERHEAD, fold, summary_request
from processors.read_documents import on_document
from processors.settings import ProcessorSettings
from processors.stage import Handler, Publish, Stage, on
from runtime.kafka import partition_count
from runtime.settings import Pool
from safety.encoder import Encoder
from storage import schema
from storage.conversations import ERASE_WAIT_S, Conversations
from storage.documents import Documents
from storage.ids import epoch_ms, id_time_us, new_id
from storage.memory import Memory, Summary
from storage.rows import Change, Message
from topics import records
from topics.events import MemoryChanged, PromptAccepted, RunCompleted, RunScheduled
from topics.pipeline import MEMORY_CHANGED, RUN_COMPLETED, RUN_SCHEDULED, named

log = logging.getLogger(__name__)

EMBEDDED = Counter(
    "parley_memory_embedded_total", "Messages embedded into a chat's memory", ["role"]
)
SUMMARIES = Counter(
    "parley_memory_summaries_total", "Summary runs", ["outcome"]
)  # requested|stored|yielded|discarded

# A summary is background work: an engine starts it only when no reply needs the engine, and stops it when
# one arrives (it is asked for again); past the engine's patience it runs beside the replies (inference/worker.py).
SUMMARY_PRIORITY = BACKGROUND_PRIORITY
CHANGED = "a message was edited, deleted or the context reset since it began"


def changed_since(chat: Any, prompt: PromptAccepted) -> bool:
    """Whether the user changed the chat's memory after the summary run `prompt` began."""
    return bool(
        chat and chat.memory_changed_at and epoch_ms(chat.memory_changed_at) >= prompt["created_at"]
    )


def now_us() -> int:
    return time.time_ns() // 1000


def summary_run(
    prompt: PromptAccepted,
    latest: Summary | None,
    version: int,
    block: list[Message],
    counter: tokens.ChatTokenizer,
    settings: ProcessorSettings,
) -> RunScheduled:
    """The summary run folding `block` into `latest` (the branch's summary before it) as `version`, the one
    after the chat's newest (pure but for its new ids and time)."""
    pool = settings.pools[settings.memory_pool]
    request = summary_request(latest.content if latest else None, block, counter)
    run_id = str(new_id())
    summary_prompt = records.prompt_accepted(
        run_id=run_id,
        chat_id=prompt["chat_id"],
        user_id=prompt["user_id"],
        tier=prompt["tier"],
        message_id=run_id,
        content=request[-1]["content"],
        max_tokens=settings.summary_max_tokens,
        model=pool.model,
        reply_partition=0,
        prev_run_id=None,
        temperature=0.2,
        store=False,
        summary={"version": version, "through": block[-1].id, "messages": len(block)},
    )
    return {
        "event_id": str(uuid.uuid4()),
        "prompt": summary_prompt,
        "pool": settings.memory_pool,
        "model": pool.model,
        "messages": request,
        "context_turns": len(block),
        "priority": SUMMARY_PRIORITY,
        "degraded_from": None,
        "estimate_tokens": counter.count_chat(request) + settings.summary_max_tokens,
        "context": None,
        "scheduled_at": summary_prompt["created_at"],
    }


def discarded(done: RunCompleted, chat: Any, latest: Summary | None) -> str | None:
    """Why a finished summary run is not stored, or None to store it (pure)."""
    text = " ".join(done["content"].split())
    request = done["prompt"]["summary"]
    assert request is not None  # only summary runs come here
    if chat is None:
        return "the chat is gone"
    if done["finish_reason"] == "cancelled":  # stopped for a reply (inference/worker.py)
        return "it gave way to a reply; asking again"
    if done["finish_reason"] not in ("stop", "length") or not text:
        return f"the run ended {done['finish_reason']} with {len(text)} characters"
    if (latest.version if latest else 0) != request["version"] - 1:
        return f"the newest summary is now v{latest.version if latest else 0}"
    if changed_since(chat, done["prompt"]):
        return CHANGED
    return None


@dataclass
class Deps:
    publish: Publish
    conversations: Conversations
    memory: Memory
    encoder: Encoder
    settings: ProcessorSettings
    counter: tokens.ChatTokenizer
    documents: Documents  # what it read of a chat's documents (processors/read_documents.py)
    pending: dict[str, float] = field(
        default_factory=dict
    )  # chat id -> when its summary run was asked for
    partitions: list[int] = field(default_factory=list)  # of the summary pool's topic, read once

    @property
    def pool(self) -> Pool:
        return self.settings.pools[self.settings.memory_pool]


async def embed(texts: list[str], deps: Deps) -> list[list[float]]:
    vectors = await asyncio.get_running_loop().run_in_executor(None, deps.encoder.embed, texts)
    return [v.tolist() for v in vectors]


async def remember(
    chat_id: uuid.UUID, owner: str, items: list[tuple[str, str, str, int]], deps: Deps
) -> None:
    """(message id, role, text, the text's time in epoch µs) -> the chat's vector index, the text sealed with
    the owner's key."""
    items = [i for i in items if i[2].strip()]
    if not items:
        return
    vectors = await embed([text for _, _, text, _ in items], deps)
    for (message_id, role, text, at_us), vector in zip(items, vectors, strict=True):
        await deps.memory.remember(chat_id, uuid.UUID(message_id), role, text, vector, at_us, owner)
        EMBEDDED.labels(role).inc()


async def reread(chat_id: uuid.UUID, deps: Deps) -> Any:
    """The chat's row, read after a write to its deps.memory; None for a chat deleted meanwhile, which may have
    been forgotten before the write (MEMORY_CHANGED is handled beside RUN_COMPLETED), so it is forgotten
    once more."""
    chat = await deps.conversations.get_chat(chat_id)
    if chat is None:
        await deps.memory.reset(chat_id, now_us())
        log.info("chat %s was deleted while its deps.memory was written; forgotten again", chat_id)
    return chat


async def answered_branch(prompt: PromptAccepted, deps: Deps) -> set[str] | None:
    """The messages of the answered run's branch (conversation/gather.py `branch_of`), its question and answer
    included; None while the chat has one branch."""
    earlier = await branch_of(prompt, deps.conversations)
    return None if earlier is None else earlier | {prompt["message_id"], prompt["run_id"]}


async def maybe_summarize(
    prompt: PromptAccepted, deps: Deps, known: tuple[Any, Mapping[str, Change]] | None = None
) -> None:
    """`known`: the chat and its changes as the caller just read them (not read again)."""
    chat_key = prompt["chat_id"]
    if time.monotonic() - deps.pending.get(chat_key, -1e9) < deps.settings.summary_timeout_s:
        return  # one summary run per chat at a time
    chat_id = uuid.UUID(chat_key)
    changes: Mapping[str, Change] | None = None
    if known is None:
        chat, latest = await asyncio.gather(
            deps.conversations.get_chat(chat_id), deps.memory.latest_summary(chat_id)
        )
    else:
        (chat, changes), latest = known, await deps.memory.latest_summary(chat_id)
    if chat is None:
        return
    newest, on_branch = latest, await answered_branch(prompt, deps)
    if latest is not None and on_branch is not None and latest.through not in on_branch:
        latest = None  # another branch's summary: this branch's is made from its own messages
    after = uuid.UUID(latest.through) if latest else None
    if chat.context_from is not None and (after is None or after.time < chat.context_from.time):
        after, latest = chat.context_from, None
    messages = [
        m
        for m in await deps.conversations.messages_after(chat_id, after, 400, changes)
        if m.content and (on_branch is None or m.id in on_branch)
    ]
    counts = [deps.counter.count(m.content) for m in messages]
    most = deps.pool.prompt_budget - deps.settings.summary_max_tokens - SUMMARY_OVERHEAD
    n = fold(
        messages,
        counts,
        deps.settings.summarize_after_tokens,
        deps.settings.summarize_keep_tokens,
        most,
    )
    if n == 0:
        return
    version = (newest.version if newest else 0) + 1
    run = summary_run(prompt, latest, version, messages[:n], deps.counter, deps.settings)
    deps.pending[chat_key] = time.monotonic()
    if not deps.partitions:
        name = named(RUN_SCHEDULED[deps.settings.memory_pool], deps.settings.namespace)
        loop = asyncio.get_running_loop()
        deps.partitions.append(
            await loop.run_in_executor(None, partition_count, deps.settings.kafka_bootstrap, name)
        )
    partition = home_partition(chat_key, deps.partitions[0])
    await deps.publish(
        RUN_SCHEDULED[deps.settings.memory_pool], run, key=chat_key, partition=partition
    )
    SUMMARIES.labels("requested").inc()
    log.info(
        "chat %s: summary of %d messages requested (run %s)", chat_key, n, run["prompt"]["run_id"]
    )


async def store_summary(done: RunCompleted, deps: Deps) -> None:
    prompt, request = done["prompt"], done["prompt"]["summary"]
    assert request is not None  # on_completed sends only summary runs here
    chat_key = prompt["chat_id"]
    chat_id = uuid.UUID(chat_key)
    deps.pending.pop(chat_key, None)
    chat, latest = await asyncio.gather(
        deps.conversations.get_chat(chat_id), deps.memory.latest_summary(chat_id)
    )
    text = " ".join(done["content"].split())
    yielded = done["finish_reason"] == "cancelled"  # stopped for a reply (inference/worker.py)
    reason = discarded(done, chat, latest)
    if not reason:
        text = deps.counter.truncate(text, deps.settings.summary_tokens)
        summary = Summary(
            request["version"], request["through"], text, deps.counter.count(text), prompt["run_id"]
        )
        await deps.memory.put_summary(chat_id, summary, prompt["user_id"])
        chat = await reread(chat_id, deps)
        if chat is None:
            return
        # A change made after the check above may have been handled before this write (it found no summary
        # to drop): take the summary back.
        if changed_since(chat, prompt):
            await deps.memory.drop_summary(chat_id, summary.version)
            reason = CHANGED
        else:
            SUMMARIES.labels("stored").inc()
            log.info(
                "chat %s: summary v%d stored (%d tokens)", chat_key, summary.version, summary.tokens
            )
    if reason:
        SUMMARIES.labels("yielded" if yielded else "discarded").inc()
        log.info("chat %s: summary v%d discarded: %s", chat_key, request["version"], reason)
    if not reason or yielded:
        await maybe_summarize(
            prompt, deps
        )  # more may have piled up meanwhile, or it gave way: ask again now
    # otherwise (failed, filtered, stale) the chat's next turn asks again: no loop of failing runs


async def on_completed(done: RunCompleted, deps: Deps) -> None:
    prompt = done["prompt"]
    if prompt.get("summary"):
        await store_summary(done, deps)
        return
    if not prompt.get("store", True) or prompt.get("messages"):
        return  # stateless runs (OpenAI route) are not chat messages
    chat_id = uuid.UUID(prompt["chat_id"])
    chat, changes = await asyncio.gather(
        deps.conversations.get_chat(chat_id), deps.conversations.changes(chat_id)
    )
    if chat is None:
        return  # deleted meanwhile: nothing of it is remembered
    written = [(prompt["message_id"], "user", prompt["content"])]
    if done["finish_reason"] != "error":
        written.append((prompt["run_id"], "assistant", done["content"]))
    # As the user left them: a change read here is applied; one made after the read wins by its later time.
    items = [
        (i, role, changes[i].content or "", epoch_ms(changes[i].at) * 1000)
        if i in changes
        else (i, role, text, id_time_us(uuid.UUID(i)))
        for i, role, text in written
    ]
    await remember(chat_id, prompt["user_id"], items, deps)
    if await reread(chat_id, deps) is None:
        return
    await maybe_summarize(prompt, deps, (chat, changes))


async def on_changed(change: MemoryChanged, deps: Deps) -> None:
    if change["action"] == "person_erased":
        return  # their chats' memory went with each chat's own chat_deleted
    chat_id = uuid.UUID(change["chat_id"])
    action = change["action"]
    at_us = change["at"] * 1000  # when the edge stored the change
    if action in ("document_added", "document_deleted"):
        await on_document(change, deps.documents, deps.encoder, deps.counter, deps.settings)
        return
    if action == "chat_deleted":
        # once the edge has deleted the row (it tells first): a write after that forgets itself
        await deps.conversations.deleted(chat_id, ERASE_WAIT_S)
        await deps.memory.reset(chat_id, now_us())
        await deps.documents.forget_chat(chat_id)
    elif action == "reset":
        await deps.memory.reset(chat_id, at_us)
    elif change["message_id"]:
        message_id = uuid.UUID(change["message_id"])
        text = change["content"] or ""
        if action == "edited" and text.strip():  # the new text replaces the old row (same key)
            item = (change["message_id"], change["role"] or "user", text, at_us)
            await remember(chat_id, change["user_id"], [item], deps)
        else:
            await deps.memory.forget(chat_id, message_id, at_us)
        await deps.memory.drop_summaries_covering(chat_id, message_id)
    deps.pending.pop(
        change["chat_id"], None
    )  # a summary begun before it is discarded when it lands
    log.info(
        "chat %s: deps.memory %s (%s)",
        change["chat_id"],
        action,
        change["message_id"] or "whole chat",
    )


HANDLERS: list[Handler[Deps]] = [on(RUN_COMPLETED, on_completed), on(MEMORY_CHANGED, on_changed)]


def build(stage: Stage, settings: ProcessorSettings) -> None:
    session = schema.connect(settings.cassandra)
    keyspace = settings.keyspace_name
    counter = tokens.load(settings.pools[settings.memory_pool].tokenizer)
    deps = Deps(
        stage.publish,
        Conversations(session, keyspace, stage.name),
        Memory(session, keyspace, stage.name),
        Encoder(),
        settings,
        counter,
        Documents(session, keyspace, stage.name),
    )
    stage.serve(HANDLERS, deps)
