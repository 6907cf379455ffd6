"""A person's chats, searchable: one ClickHouse row per stored message (the question and the answer of each run,
an edit replacing its message's row), with a full-text `text` index on the lowercased content and the message's
MiniLM vector beside it. Written by the metering stage from the log (processors/search_index.py), read through
its internal page by `GET /v1/search`. Design: docs/decisions/0025-search-store.md.

Every query starts with the person's id, the table's first key: nobody's search reads another person's rows.
A deleted message or chat is removed and remembered in `chat_search_removed`, so a row that arrives after its
delete (the log's topics are read side by side) is dropped on arrival and removed again if it slipped in.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from storage.clickhouse import Backend, iso, quote

MAX_TERMS = 16
MAX_QUERY_CHARS = 256
SNIPPET_CHARS = 160
MAX_RANKED = 2000
MEANING_FLOOR = 0.3  # cosine similarity below which a message is not "about" the query (MiniLM)
# A token as ClickHouse's splitByNonAlpha and hasToken see it: ASCII letters and digits, and any non-ASCII
# character, so "café" and "日本語" are words and "_" or "-" part them.
TOKEN = re.compile(r"[0-9A-Za-z\u0080-\U0010ffff]+")
COLUMNS = ("user_id", "chat_id", "message_id", "role", "content", "embedding", "created_at")


def ddl(db: str) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS {db}.chat_search (
             user_id String, chat_id String, message_id String, role LowCardinality(String), content String,
             terms String MATERIALIZED lowerUTF8(content), embedding Array(Float32),
             created_at DateTime64(3, 'UTC'),
             INDEX words terms TYPE text(tokenizer = splitByNonAlpha) GRANULARITY 1
           ) ENGINE = MergeTree ORDER BY (user_id, chat_id, message_id)""",
        # message_id '' stands for the whole chat
        f"""CREATE TABLE IF NOT EXISTS {db}.chat_search_removed (
             user_id String, chat_id String, message_id String, at DateTime64(3, 'UTC')
           ) ENGINE = ReplacingMergeTree ORDER BY (user_id, chat_id, message_id)""",
    ]


@dataclass(frozen=True)
class Query:
    """A search as typed: whole words, and the last word still being typed (matched as a prefix)."""

    words: tuple[str, ...]
    prefix: str

    @classmethod
    def parse(cls, text: str) -> Query:
        found = TOKEN.findall(text.lower())
        if found and not text[-1:].isspace() and TOKEN.fullmatch(text[-1:].lower() or " "):
            return cls(tuple(dict.fromkeys(found[:-1])), found[-1])
        return cls(tuple(dict.fromkeys(found)), "")

    @property
    def terms(self) -> int:
        return len(self.words) + bool(self.prefix)

    def matches(self, token: str) -> bool:
        return token in self.words or bool(self.prefix) and token.startswith(self.prefix)


def write(backend: Backend, db: str, rows: list[dict[str, Any]]) -> int:
    """Insert the rows of messages not stored yet and not removed; returns how many. A redelivered batch adds
    nothing, and an edit (already stored) wins over its message's original arriving late. `created_at` in ms."""
    batch = {(r["user_id"], r["message_id"]): r for r in rows}
    if not batch:
        return 0
    keys = ", ".join(f"({quote(u)}, {quote(m)})" for u, m in batch)
    for row in backend.query(
        f"SELECT user_id, message_id FROM {db}.chat_search WHERE (user_id, message_id) IN ({keys})"
    ):
        batch.pop((row["user_id"], row["message_id"]), None)
    for gone in removed(backend, db, list(batch.values())):
        batch.pop(gone, None)
    if not batch:
        return 0
    backend.insert_json(
        f"{db}.chat_search",
        [{k: r[k] for k in COLUMNS} | {"created_at": iso(r["created_at"])} for r in batch.values()],
    )
    # a delete handled between the check and the insert: its rows go again
    for user_id, message_id in removed(backend, db, list(batch.values())):
        drop(backend, db, user_id, message_id)
    return len(batch)


def drop(backend: Backend, db: str, user_id: str, message_id: str) -> None:
    backend.command(
        f"DELETE FROM {db}.chat_search WHERE user_id = {quote(user_id)} AND message_id = {quote(message_id)}"
    )


def removed(backend: Backend, db: str, rows: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(user, message) of the rows whose message or chat has been removed."""
    if not rows:
        return set()
    chats = ", ".join(f"({quote(r['user_id'])}, {quote(r['chat_id'])})" for r in rows)
    marks = backend.query(
        f"SELECT user_id, chat_id, message_id FROM {db}.chat_search_removed "
        f"WHERE (user_id, chat_id) IN ({chats})"
    )
    gone = {(m["user_id"], m["chat_id"], m["message_id"]) for m in marks}
    return {
        (r["user_id"], r["message_id"])
        for r in rows
        if (r["user_id"], r["chat_id"], "") in gone
        or (r["user_id"], r["chat_id"], r["message_id"]) in gone
    }


def remove(
    backend: Backend, db: str, user_id: str, chat_id: str, message_id: str, at_ms: int
) -> None:
    """A deleted message (or, with message_id '', a deleted chat): gone from search now and from then on."""
    backend.insert_json(
        f"{db}.chat_search_removed",
        [{"user_id": user_id, "chat_id": chat_id, "message_id": message_id, "at": iso(at_ms)}],
    )
    which = f" AND message_id = {quote(message_id)}" if message_id else ""
    backend.command(
        f"DELETE FROM {db}.chat_search WHERE user_id = {quote(user_id)} "
        f"AND chat_id = {quote(chat_id)}{which}"
    )


def remove_person(backend: Backend, db: str, user_id: str) -> None:
    """An erased person: every entry of theirs gone (each chat's removal mark stays, so an answer that lands
    late is not indexed)."""
    backend.command(f"DELETE FROM {db}.chat_search WHERE user_id = {quote(user_id)}")


def replace(backend: Backend, db: str, row: dict[str, Any]) -> None:
    """An edited message: its row now holds the new text (unless the message was removed)."""
    drop(backend, db, row["user_id"], row["message_id"])
    write(backend, db, [row])


def by_words(
    backend: Backend, db: str, user_id: str, query: Query, limit: int
) -> list[dict[str, Any]]:
    """The person's messages with every word (and a word starting with the prefix), best first.

    Score: each word's count in the message, saturated and normalised by the message's length as BM25 does
    (k1 1.2, b 0.75, an average message of 40 words); no document frequency, since every hit has every word.
    Only the newest MAX_RANKED matches are ranked: a word in most of a long history ("the", or a first letter
    typed) costs the same as a rare one.
    """
    where = [f"user_id = {quote(user_id)}"]
    where += [f"hasToken(terms, {quote(w)})" for w in query.words]
    counts = [f"countEqual(toks, {quote(w)})" for w in query.words]
    if query.prefix:
        starts = f"t -> startsWith(t, {quote(query.prefix)})"
        where.append(f"arrayExists({starts}, splitByNonAlpha(terms))")
        counts.append(f"length(arrayFilter({starts}, toks))")
    norm = "1.2 * (0.25 + 0.75 * length(toks) / 40)"
    score = " + ".join(f"{c} * 2.2 / ({c} + {norm})" for c in counts)
    return backend.query(
        f"SELECT chat_id, message_id, role, content, toUnixTimestamp64Milli(created_at) AS at, {score} AS score "
        f"FROM (SELECT chat_id, message_id, role, content, created_at, splitByNonAlpha(terms) AS toks "
        f"FROM {db}.chat_search WHERE {' AND '.join(where)} ORDER BY created_at DESC LIMIT {MAX_RANKED}) "
        f"ORDER BY score DESC, created_at DESC LIMIT {int(limit)}"
    )


def by_meaning(
    backend: Backend, db: str, user_id: str, vector: list[float], limit: int
) -> list[dict[str, Any]]:
    """The person's messages nearest the query's vector, at least MEANING_FLOOR alike, nearest first."""
    near = "[" + ",".join(f"{x:.6f}" for x in vector) + "]"
    return backend.query(
        f"SELECT chat_id, message_id, role, content, at, score FROM (SELECT chat_id, message_id, role, content, "
        f"toUnixTimestamp64Milli(created_at) AS at, 1 - cosineDistance(embedding, {near}) AS score "
        f"FROM {db}.chat_search "
        f"WHERE user_id = {quote(user_id)} AND length(embedding) = {len(vector)} "
        f"ORDER BY score DESC LIMIT {int(limit)}) WHERE score >= {MEANING_FLOOR}"
    )


def snippet(content: str, query: Query | None) -> tuple[str, list[tuple[int, int]]]:
    """Up to SNIPPET_CHARS of the message around its first matching word, and where the matching words are in
    it ([start, end) offsets); the message's start when nothing matches (a hit by meaning)."""
    found = [m for m in TOKEN.finditer(content) if query and query.matches(m.group().lower())]
    start = 0
    if found and len(content) > SNIPPET_CHARS:
        start = max(0, found[0].start() - SNIPPET_CHARS // 3)
        if start:  # begin at a word
            space = content.find(" ", start)
            start = space + 1 if 0 <= space < found[0].start() else start
    end = min(len(content), start + SNIPPET_CHARS)
    text = ("…" if start else "") + content[start:end] + ("…" if end < len(content) else "")
    shift = start - (1 if start else 0)
    marks = [
        (m.start() - shift, m.end() - shift) for m in found if m.start() >= start and m.end() <= end
    ]
    return text, marks


def hit(row: dict[str, Any], match: str, query: Query | None) -> dict[str, Any]:
    text, marks = snippet(row["content"], query)
    score = float(row["score"])
    return {
        "chat_id": row["chat_id"],
        "message_id": row["message_id"],
        "role": row["role"],
        "snippet": text,
        "highlights": [list(m) for m in marks],
        "score": round(score, 4) if math.isfinite(score) else 0.0,
        "match": match,
        "created_at": int(row["at"]),
    }
