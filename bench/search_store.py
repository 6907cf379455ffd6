"""Where to search a person's chats, measured: 100,000 messages of one person (and 100,000 of four others beside
them), searched by words and by meaning, in the ClickHouse engine we already run (chdb here; a server in
production), with its full-text `text` index and without it, against the floor of reading the person's newest 20
rows; the queries are the ones search runs (storage/search.py). And Cassandra 5.0.8, the store the messages live
in: whether its SAI takes a text analyzer.

- words: every message with all the query's words (lowercased tokens), ranked, the best 20;
- prefix: the last word as typed so far ("ligh" finds "lighthouse"), over the person's messages, ranked; and
  the worst case, one letter that starts every word of every message;
- a word in 90% of the messages ("w1"): only the newest 2,000 matches are ranked;
- meaning: the 10 nearest of the person's 100,000 MiniLM-sized (384-d) vectors, by cosine, scanned;
- freshness: a message written as the stage writes one (`search.write`), then searched until found.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from measure import summary  # noqa: E402

from storage import search  # noqa: E402
from storage.clickhouse import ChdbBackend, quote  # noqa: E402
from storage.search import Query  # noqa: E402

PERSON = "person-0"
VOCABULARY = 5000  # made-up words, used by a Zipf law (a few common, most rare)
MARKED = "lighthouse"  # in one message of 2,000


def tables(backend: ChdbBackend) -> None:
    """The shipped table (storage/search.py) in `indexed`, and the same without its text index in `scanned`."""
    for db, keep in (("indexed", True), ("scanned", False)):
        backend.command(f"CREATE DATABASE {db}")
        for statement in search.ddl(db):
            if not keep:
                statement = statement.replace(INDEX_LINE, "").replace(
                    "DateTime64(3, 'UTC'),\n", "DateTime64(3, 'UTC')\n"
                )
            backend.command(statement)


INDEX_LINE = "             INDEX words terms TYPE text(tokenizer = splitByNonAlpha) GRANULARITY 1\n"


def fill(backend: ChdbBackend, user: str, messages: int) -> None:
    """`messages` of made-up words in 400 chats, and a random 384-d vector each, made by the engine."""
    words = "[" + ",".join(f"'w{i}'" for i in range(VOCABULARY)) + f",'{MARKED}']"
    # a word's rank is log-uniform (a few common, most rare); the argument keeps each draw its own
    rank = f"least({VOCABULARY - 1}, floor(exp(randCanonical(i + number) * log({VOCABULARY}))))"
    backend.command(  # into `indexed`; copied into `scanned` once every person is in
        f"INSERT INTO indexed.chat_search ({COLUMNS}) "
        f"SELECT {quote(user)}, toString(number % 400), toString(generateUUIDv7()), 'user', "
        f"arrayStringConcat(arrayMap(i -> if(i = 0 AND number % 2000 = 7, '{MARKED}', "
        f"{words}[1 + toUInt32({rank})]), range(10 + number % 50)), ' '), "
        f"arrayMap(i -> randNormal(0, 1, i + number), range(384)), now64(3) FROM numbers({messages})"
    )


COLUMNS = "user_id, chat_id, message_id, role, content, embedding, created_at"


def ways(vector: list[float]) -> dict[str, Callable[[ChdbBackend], list[dict[str, Any]]]]:
    """The shipped queries (storage/search.py), on the indexed table and on the one without the index."""
    two, common, typed = Query.parse(f"{MARKED} w3 "), Query.parse("w1 "), Query.parse("ligh")
    letter = Query.parse("w")  # the first letter typed: every made-up word starts with it
    mine = quote(PERSON)
    return {
        "words_text_index": lambda b: search.by_words(b, "indexed", PERSON, two, 20),
        "words_scanned": lambda b: search.by_words(b, "scanned", PERSON, two, 20),
        "one_common_word_text_index": lambda b: search.by_words(b, "indexed", PERSON, common, 20),
        "prefix_as_typed": lambda b: search.by_words(b, "indexed", PERSON, typed, 20),
        "one_letter_typed_every_message": lambda b: search.by_words(b, "indexed", PERSON, letter, 20),
        "meaning_scanned": lambda b: search.by_meaning(b, "indexed", PERSON, vector, 10),
        "floor_newest_20": lambda b: b.query(
            f"SELECT message_id, content FROM indexed.chat_search WHERE user_id = {mine} "
            "ORDER BY created_at DESC LIMIT 20"
        ),
    }


def timed(backend: ChdbBackend, query: Callable[[ChdbBackend], list[dict[str, Any]]]) -> tuple[float, int]:
    started = time.perf_counter()
    rows = query(backend)
    return (time.perf_counter() - started) * 1000, len(rows)


def freshness(backend: ChdbBackend) -> float:
    """ms from a message's write (the stage's `search.write`: checks, insert, check) to the words search finding it."""
    word = f"fresh{uuid.uuid4().hex[:8]}"
    row = {
        "user_id": PERSON,
        "chat_id": "fresh",
        "message_id": str(uuid.uuid4()),
        "role": "user",
        "content": f"just sent {word}",
        "embedding": [],
        "created_at": int(time.time() * 1000),
    }
    started = time.perf_counter()
    search.write(backend, "indexed", [row])
    while not search.by_words(backend, "indexed", PERSON, Query.parse(f"{word} "), 20):
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
    backend.command(f"INSERT INTO scanned.chat_search ({COLUMNS}) SELECT {COLUMNS} FROM indexed.chat_search")
    filled_s = time.perf_counter() - started
    import random

    vector = [random.gauss(0, 1) for _ in range(384)]
    queries = ways(vector)
    times: dict[str, list[float]] = {name: [] for name in queries}
    found: dict[str, int] = {}
    for query in queries.values():  # warm
        query(backend)
    for _ in tqdm(range(args.rounds), desc="rounds", file=sys.stderr):
        for name, query in queries.items():
            ms, found[name] = timed(backend, query)
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
