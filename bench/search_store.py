"""Where to search a person's chats, measured: 100,000 messages of one person (and 100,000 of four others beside
them), searched by words and by meaning, in the ClickHouse engine we already run (chdb here; a server in
production), with its full-text `text` index and without it, against the floor of reading the person's newest 20
rows. And Cassandra 5.0.8, the store the messages live in: whether its SAI takes a text analyzer.

- words: every message with all the query's words (lowercased tokens), the newest first, 20;
- prefix: the last word as typed so far ("ligh" finds "lighthouse"), over the person's messages;
- meaning: the 10 nearest of the person's 100,000 MiniLM-sized (384-d) vectors, by cosine, scanned;
- freshness: a message inserted as a stage inserts a batch, then searched until found.

Interleaved round by round so the machine's noise falls on all alike. Prints JSON, writes
bench/results/search_store.json. Needs Cassandra for the analyzer check (started if not running).
Usage: python bench/search_store.py [--rounds 40] [--messages 100000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from measure import summary  # noqa: E402

from storage.clickhouse import ChdbBackend, quote  # noqa: E402

PERSON = "person-0"
VOCABULARY = 5000  # made-up words, used by a Zipf law (a few common, most rare)
MARKED = "lighthouse"  # in one message of 2,000


def tables(backend: ChdbBackend) -> None:
    for name, index in (
        ("indexed", ", INDEX words terms TYPE text(tokenizer = splitByNonAlpha) GRANULARITY 1"),
        ("scanned", ""),
    ):
        backend.command(
            f"CREATE TABLE {name} (user_id String, message_id UUID, chat_id UUID, content String, "
            f"terms String MATERIALIZED lower(content), embedding Array(Float32){index}) "
            "ENGINE = MergeTree ORDER BY (user_id, message_id)"
        )


def fill(backend: ChdbBackend, user: str, messages: int) -> None:
    """`messages` of made-up words in 400 chats, and a random 384-d vector each, made by the engine."""
    words = "[" + ",".join(f"'w{i}'" for i in range(VOCABULARY)) + f",'{MARKED}']"
    # a word's rank is log-uniform (a few common, most rare); the argument keeps each draw its own
    rank = f"least({VOCABULARY - 1}, floor(exp(randCanonical(i + number) * log({VOCABULARY}))))"
    chat = "reinterpretAsUUID(toFixedString(toString(number % 400), 16))"
    backend.command(  # into `indexed`; copied into `scanned` once every person is in
        "INSERT INTO indexed (user_id, message_id, chat_id, content, embedding) "
        f"SELECT {quote(user)}, generateUUIDv7(), {chat}, "
        f"arrayStringConcat(arrayMap(i -> if(i = 0 AND number % 2000 = 7, '{MARKED}', "
        f"{words}[1 + toUInt32({rank})]), range(10 + number % 50)), ' '), "
        f"arrayMap(i -> randNormal(0, 1, i + number), range(384)) FROM numbers({messages})"
    )


def ways(vector: list[float]) -> dict[str, str]:
    person = quote(PERSON)
    near = "[" + ",".join(f"{x:.5f}" for x in vector) + "]"
    mine = f"user_id = {person}"
    words = f"{mine} AND hasAllTokens(terms, ['{MARKED}', 'w3'])"
    newest = "ORDER BY message_id DESC LIMIT 20"
    common = f"{mine} AND hasAllTokens(terms, ['w1'])"
    return {
        "words_text_index": f"SELECT message_id, chat_id, content FROM indexed WHERE {words} {newest}",
        "words_scanned": f"SELECT message_id, chat_id, content FROM scanned WHERE {words} {newest}",
        "one_common_word_text_index": f"SELECT message_id FROM indexed WHERE {common} {newest}",
        "prefix_scanned": f"SELECT message_id, content FROM indexed WHERE {mine} AND "
        f"arrayExists(t -> startsWith(t, 'ligh'), splitByNonAlpha(terms)) {newest}",
        "meaning_scanned": f"SELECT message_id, cosineDistance(embedding, {near}) AS d FROM indexed "
        f"WHERE {mine} ORDER BY d LIMIT 10",
        "floor_newest_20": f"SELECT message_id, content FROM indexed WHERE {mine} {newest}",
    }


def timed(backend: ChdbBackend, sql: str) -> tuple[float, int]:
    started = time.perf_counter()
    rows = backend.query(sql)
    return (time.perf_counter() - started) * 1000, len(rows)


def freshness(backend: ChdbBackend) -> float:
    """ms from a message's insert to the words search finding it."""
    word = f"fresh{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    backend.command(
        f"INSERT INTO indexed (user_id, message_id, chat_id, content, embedding) VALUES "
        f"({quote(PERSON)}, generateUUIDv7(), generateUUIDv4(), 'just sent {word}', [])"
    )
    while not backend.query(
        f"SELECT 1 FROM indexed WHERE user_id = {quote(PERSON)} AND hasAllTokens(terms, ['{word}'])"
    ):
        time.sleep(0.001)
    return (time.perf_counter() - started) * 1000


def cassandra_analyzer() -> str:
    """What Cassandra's SAI says to an analyzed text index (Cassandra 5.0.8 here)."""
    from cassandra.cluster import Cluster

    session = Cluster(["127.0.0.1"]).connect()
    keyspace = f"bench_search_{uuid.uuid4().hex[:6]}"
    try:
        session.execute(
            f"CREATE KEYSPACE {keyspace} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}"
        )
        session.execute(
            f"CREATE TABLE {keyspace}.m (user_id text, message_id timeuuid, content text, "
            "PRIMARY KEY ((user_id), message_id))"
        )
        analyzer = '{"tokenizer": {"name": "standard"}, "filters": [{"name": "lowercase"}]}'
        try:
            session.execute(
                f"CREATE CUSTOM INDEX ON {keyspace}.m (content) USING 'StorageAttachedIndex' "
                f"WITH OPTIONS = {{'index_analyzer': '{analyzer}'}}"
            )
            return "accepted"
        except Exception as exc:  # the refusal is the finding
            return f"refused: {exc}"
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")
        session.cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--messages", type=int, default=100_000)
    args = parser.parse_args()
    subprocess.run(["bash", str(ROOT / "infra" / "local" / "cassandra.sh"), "start"], check=True)
    backend = ChdbBackend(Path(tempfile.mkdtemp(prefix="search-store-")))
    tables(backend)
    started = time.perf_counter()
    fill(backend, PERSON, args.messages)
    for other in range(1, 5):
        fill(backend, f"person-{other}", args.messages // 4)
    columns = "user_id, message_id, chat_id, content, embedding"
    backend.command(f"INSERT INTO scanned ({columns}) SELECT {columns} FROM indexed")  # the same rows
    filled_s = time.perf_counter() - started
    import random

    vector = [random.gauss(0, 1) for _ in range(384)]
    queries = ways(vector)
    times: dict[str, list[float]] = {name: [] for name in queries}
    found: dict[str, int] = {}
    for sql in queries.values():  # warm
        backend.query(sql)
    for _ in tqdm(range(args.rounds), desc="rounds", file=sys.stderr):
        for name, sql in queries.items():
            ms, found[name] = timed(backend, sql)
            times[name].append(ms)
    fresh = [freshness(backend) for _ in range(20)]
    stats = {name: summary(values) for name, values in times.items()}
    floor = stats["floor_newest_20"]["p50"]
    result: dict[str, Any] = {
        "bench": "search_store",
        "rounds": args.rounds,
        "messages_of_the_person": args.messages,
        "messages_in_all": args.messages * 2,
        "fill_s": round(filled_s, 1),
        "ms": stats,
        "rows_found": found,
        "over_floor_p50": {name: round(stats[name]["p50"] / floor, 1) for name in queries},
        "text_index_over_scan_p50": round(stats["words_text_index"]["p50"] / stats["words_scanned"]["p50"], 2),
        "freshness_ms": summary(fresh),
        "cassandra_sai_analyzer": cassandra_analyzer(),
    }
    text = json.dumps(result, indent=2)
    print(text)
    (ROOT / "bench" / "results" / "search_store.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
