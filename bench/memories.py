"""What recalling a person's memories adds to a run's context, on the real Cassandra and the shared encoder: for a
person keeping 10 and 200 memories (the most allowed), the scheduler's recall (`conversation/memories.py` through
`conversation/gather.py` person_memories: the new message embedded, the person's 8 nearest memories read from
their partition's vector index, ranked and screened; each memory's screening is cached after its first, as in the
scheduler) beside what a chat's later turn already reads (the window: the newest 160 messages of a 100-turn chat).
Interleaved round by round so the machine's noise falls on all alike.

Prints JSON, writes bench/results/memories.json. Starts the local Cassandra if it is not running.
Usage: python bench/memories.py [--rounds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from measure import summary, timed  # noqa: E402

from conversation.gather import ContextGuard, person_memories  # noqa: E402
from conversation.settings import ContextSettings  # noqa: E402
from runtime.settings import StackSettings  # noqa: E402
from safety.moderator import Moderator  # noqa: E402
from safety.policy import BUILTIN  # noqa: E402
from storage.conversations import Conversations  # noqa: E402
from storage.ids import new_id  # noqa: E402
from storage.memories import Memories  # noqa: E402
from storage.rows import Message  # noqa: E402
from storage.schema import migrate  # noqa: E402
from storage.session import connect_session  # noqa: E402
from topics import records  # noqa: E402

SIZES = (10, 200)
TEXT = "A message of ordinary length, about as long as a question or a short answer in a chat. " * 3
FACTS = ("I prefer metric units.", "My team is Platform.", "I live in Oslo.", "My cat is called Mochi.")


class Policies:
    """The built-in policy for every tier (a replica with no policy published reads it too)."""

    def for_tier(self, tier: str) -> Any:
        return BUILTIN


async def measure(rounds: int) -> dict[str, Any]:
    settings = StackSettings(namespace=f"bench{uuid.uuid4().hex[:6]}", cassandra_replication={"datacenter1": 1})
    cassandra = settings.cassandra
    migrate(cassandra)
    session = connect_session(cassandra)
    moderator = Moderator()
    guard = ContextGuard(moderator, Policies())  # type: ignore[arg-type]
    context = ContextSettings()
    try:
        store = Memories(session, cassandra.keyspace, "api")
        people = {}
        for n in SIZES:
            person = f"p{n}-{uuid.uuid4().hex[:6]}"
            texts = [f"{FACTS[i % len(FACTS)]} (note {i})" for i in range(n)]
            vectors = moderator.encoder.embed(texts)
            for text, vector in zip(texts, vectors, strict=True):
                await store.put(person, new_id(), text, [float(x) for x in vector], "settings")
            people[n] = person
        writer = Conversations(session, cassandra.keyspace, "persistence")
        chat, at = new_id(), datetime.now(UTC)
        for _ in range(100):
            q, a = str(new_id()), str(new_id())
            await writer.put_message(chat, Message(q, "user", TEXT, at, a))
            await writer.put_message(chat, Message(a, "assistant", TEXT, at, a, "m", "stop", "small"))

        def prompt(person: str) -> Any:
            return records.prompt_accepted(
                run_id=str(new_id()), chat_id=str(chat), user_id=person, tier="free", message_id=str(new_id()),
                content="Which units do I like, and how tall is Everest?", max_tokens=64, model=None,
                reply_partition=0, prev_run_id=None, memories=True,
            )  # fmt: skip

        ways: dict[str, Any] = {
            **{
                f"recall_{n}_memories": (lambda p=people[n]: person_memories(prompt(p), store, guard, context))
                for n in SIZES
            },
            "window_160_messages": lambda: writer.messages_after(chat, None, 160),
        }
        times: dict[str, list[float]] = {w: [] for w in ways}
        for _ in range(5):  # warm every statement, and the guard's cache
            for way in ways.values():
                await way()
        for _ in tqdm(range(rounds), desc="rounds", file=sys.stderr):
            for name, way in ways.items():
                times[name].append(await timed(way()))
        stats = {name: summary(values) for name, values in times.items()}
        used = (await person_memories(prompt(people[200]), store, guard, context))[1].used
        base = stats["window_160_messages"]["p50"]
        return {
            "ms": stats,
            "recall_over_window_p50": {n: round(stats[f"recall_{n}_memories"]["p50"] / base, 2) for n in SIZES},
            "recalled_of_200": [m.content for m in used],
        }
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {cassandra.keyspace}")
        session.cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    subprocess.run(["bash", str(ROOT / "infra" / "local" / "cassandra.sh"), "start"], check=True)
    result = {"bench": "memories", "rounds": args.rounds, **asyncio.run(measure(args.rounds))}
    text = json.dumps(result, indent=2)
    print(text)
    (ROOT / "bench" / "results" / "memories.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
