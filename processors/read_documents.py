"""The memory stage reads a document attached to a chat (a `document_added` MemoryChanged): its file from
Cassandra, its text by conversation/documents.py (in a worker thread: a long PDF is seconds of CPU), cut into
passages, each counted with the serving tokenizer and embedded with the shared encoder, then stored with a
status that makes them count (storage/documents.py). A file that cannot be read is stored as failed with its
reason, which the chat shows. A document deleted while it was read is forgotten again once its passages are
written; `document_deleted` and a deleted chat forget what was read."""

from __future__ import annotations

import asyncio
import logging
import uuid

from prometheus_client import Counter

from conversation.documents import Limits, Refused, extract, passages
from conversation.tokens import ChatTokenizer
from runtime.settings import StackSettings
from safety.encoder import Encoder
from storage.documents import Documents, Status
from topics.events import MemoryChanged

log = logging.getLogger(__name__)
READ = Counter("parley_documents_read_total", "Documents the memory stage read", ["outcome"])
BATCH = 32  # passages embedded at once


async def on_document(
    change: MemoryChanged,
    store: Documents,
    encoder: Encoder,
    counter: ChatTokenizer,
    settings: StackSettings,
) -> None:
    chat_id, document_id = uuid.UUID(change["chat_id"]), uuid.UUID(change["document_id"] or "")
    if change["action"] == "document_deleted":
        await store.forget(chat_id, document_id)
        log.info("chat %s: document %s forgotten", chat_id, document_id)
        return
    document = await store.get(chat_id, document_id)
    if document is None:  # deleted before it was read
        return
    limits = Limits(
        max_bytes=settings.document_max_mib * 1024 * 1024, max_pages=settings.document_max_pages
    )
    data = await store.data(document)
    try:
        _, sections = await asyncio.to_thread(extract, document.name, data, limits)
    except Refused as exc:
        failed = Status("failed", exc.code, exc.message, 0, 0, 0)
        await store.read(chat_id, document_id, [], failed, document.user_id)
        READ.labels(exc.code).inc()
        log.info("chat %s: document %s not read: %s", chat_id, document_id, exc.code)
        return
    found = passages(sections, settings.document_passage_chars)
    vectors: list[list[float]] = []
    for start in range(0, len(found), BATCH):
        texts = [p.text for p in found[start : start + BATCH]]
        vectors += [v.tolist() for v in await asyncio.to_thread(encoder.embed, texts)]
    rows = [
        (p.index, p.where, p.text, counter.count(p.text), v)
        for p, v in zip(found, vectors, strict=True)
    ]
    chars = sum(len(s.text) for s in sections)
    ready = Status("ready", "", "", len(found), chars, len(sections))
    await store.read(chat_id, document_id, rows, ready, document.user_id)
    if await store.get(chat_id, document_id) is None:  # deleted while it was read
        await store.forget(chat_id, document_id)
    READ.labels("ready").inc()
    log.info(
        "chat %s: document %s read: %d passages, %d characters",
        chat_id,
        document_id,
        len(found),
        chars,
    )
