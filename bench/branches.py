"""What a chat's tree costs, on the real Cassandra: chats of 10, 100 and 500 turns (a branch every tenth question),
written as the persistence stage writes them. Per size, interleaved round by round so the machine's noise falls
on all alike:

- listing: the current branch with parents and siblings (`api/branches.py` listed_branch: the skeleton and every
  message) beside the first page of 50 messages in time order (what the listing read before the tree);
- context: the skeleton the scheduler now reads for a run's branch (`conversation/gather.py` branch_of) beside
  the window it already read (the newest 160 messages).

Prints JSON, writes bench/results/branches.json. Starts the local Cassandra if it is not running.
Usage: python bench/branches.py [--rounds 60]
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

from api.branches import listed_branch  # noqa: E402
from runtime.settings import StackSettings  # noqa: E402
from storage.conversations import Conversations  # noqa: E402
from storage.ids import new_id  # noqa: E402
from storage.preferences import Preferences  # noqa: E402
from storage.rows import Message  # noqa: E402
from storage.schema import migrate  # noqa: E402
from storage.session import connect_session  # noqa: E402
from storage.tree import ROOT_ID  # noqa: E402

SIZES = (10, 100, 500)
TEXT = "A message of ordinary length, about as long as a question or a short answer in a chat. " * 3


async def write_chat(store: Conversations, turns: int) -> uuid.UUID:
    """A chat of `turns` questions and answers; every tenth question is edited and sent again (a sibling)."""
    chat, answer, at = new_id(), ROOT_ID, datetime.now(UTC)
    for turn in range(turns):
        q, a = str(new_id()), str(new_id())
        await store.put_message(chat, Message(q, "user", TEXT, at, a, parent_id=answer))
        await store.put_message(chat, Message(a, "assistant", TEXT, at, a, "m", "stop", "small", parent_id=q))
        if turn % 10 == 9:  # an edit sent again: the branch goes on from its answer
            q2, a2 = str(new_id()), str(new_id())
            await store.put_message(chat, Message(q2, "user", TEXT, at, a2, parent_id=answer))
            await store.put_message(chat, Message(a2, "assistant", TEXT, at, a2, "m", "stop", "small", parent_id=q2))
            a = a2
        answer = a
    return chat


async def measure(rounds: int) -> dict[str, Any]:
    settings = StackSettings(namespace=f"bench{uuid.uuid4().hex[:6]}", cassandra_replication={"datacenter1": 1})
    cassandra = settings.cassandra
    migrate(cassandra)
    session = connect_session(cassandra)
    try:
        writer = Conversations(session, cassandra.keyspace, "persistence")
        reader = Conversations(session, cassandra.keyspace, "api")
        preferences = Preferences(session, cassandra.keyspace, "api")
        chats = {n: await write_chat(writer, n) for n in SIZES}
        ways = {
            "listing_tree": lambda c: listed_branch(reader, preferences, c, None),
            "listing_page_before": lambda c: reader.list_messages(c, 50, None),
            "context_skeleton": lambda c: reader.skeleton(c),
            "context_window": lambda c: reader.messages_after(c, None, 160),
        }
        times = {n: {w: [] for w in ways} for n in SIZES}
        for _ in range(5):  # warm every statement
            for chat in chats.values():
                for way in ways.values():
                    await way(chat)
        for _ in tqdm(range(rounds), desc="rounds", file=sys.stderr):
            for n, chat in chats.items():
                for name, way in ways.items():
                    times[n][name].append(await timed(way(chat)))
        out: dict[str, Any] = {}
        for n in SIZES:
            stats = {name: summary(values) for name, values in times[n].items()}
            messages = len(await reader.skeleton(chats[n]))
            out[f"{n}_turns"] = {
                "messages": messages,
                "ms": stats,
                "listing_ratio_p50": round(stats["listing_tree"]["p50"] / stats["listing_page_before"]["p50"], 2),
                "skeleton_over_window_p50": round(stats["context_skeleton"]["p50"] / stats["context_window"]["p50"], 2),
            }
        return out
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {cassandra.keyspace}")
        session.cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    subprocess.run(["bash", str(ROOT / "infra" / "local" / "cassandra.sh"), "start"], check=True)
    result = {"bench": "branches", "rounds": args.rounds, "sizes": asyncio.run(measure(args.rounds))}
    text = json.dumps(result, indent=2)
    print(text)
    (ROOT / "bench" / "results" / "branches.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
