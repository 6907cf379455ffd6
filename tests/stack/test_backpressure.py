"""A client slower than its run costs a bounded buffer: the stream then catches up from the log, losing nothing."""

import asyncio
import time
from types import SimpleNamespace

from confluent_kafka import Producer

from api import streams
from api.replies import ReplyHub
from api.settings import ApiSettings
from storage.ids import new_id
from topics import codec
from topics.pipeline import TOKEN_DELTA

from .conftest import BOOTSTRAP

PARTITION = 7  # a reply partition this test's own hub reads (in a group of its own, beside the stack's edges)
RECORDS = 60


def record(run_id: str, seq: int, kind: str, **fields) -> bytes:
    return codec.encode(
        TOKEN_DELTA.schema,
        {
            "run_id": run_id,
            "chat_id": str(new_id()),
            "seq": seq,
            "kind": kind,
            "text": fields.get("text", ""),
            "model": "m",
            "finish_reason": fields.get("finish_reason"),
            "usage": None,
            "error_code": None,
            "error_message": None,
            "emitted_at": int(time.time() * 1000),
        },
    )


async def test_an_overflowing_stream_catches_up_from_the_log_with_no_gap(live):
    settings = ApiSettings(namespace=live.namespace, kafka_bootstrap=BOOTSTRAP)
    hub = ReplyHub(BOOTSTRAP, live.namespace, buffer=4, group=f"{live.namespace}.test-backpressure")
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, hub.start, loop)
    try:
        run_id = str(new_id())
        assert PARTITION in hub.partitions
        run = hub.open(run_id, PARTITION)
        producer = Producer({"bootstrap.servers": BOOTSTRAP})
        topic = live.topic(TOKEN_DELTA)
        producer.produce(topic, record(run_id, 0, "started"), partition=PARTITION)
        for seq in range(1, RECORDS - 1):
            producer.produce(topic, record(run_id, seq, "delta", text=f"<{seq}>"), partition=PARTITION)
        producer.produce(topic, record(run_id, RECORDS - 1, "completed", finish_reason="stop"), partition=PARTITION)
        producer.flush(10)

        deadline = time.monotonic() + 20
        while not run.overflowed and time.monotonic() < deadline:  # the client has not read anything yet
            await asyncio.sleep(0.05)
        assert run.overflowed and run.queue.qsize() == 4, "the hub held no more than the bound"

        deps = SimpleNamespace(settings=settings, replies=hub)
        got = [reply async for reply in streams.live(deps, run_id, PARTITION, run)]
        assert [r.record["seq"] for r in got] == list(range(RECORDS)), "every record once, in order"
        cursors = [int(r.cursor.split(":")[2]) for r in got]
        assert cursors == sorted(set(cursors))
    finally:
        await loop.run_in_executor(None, hub.stop)
