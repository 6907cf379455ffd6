"""The reply hub's partitions come from its group: new runs go to partitions it holds, and a stream whose
partition is taken away is handed to a read from the log instead of waiting for records that never come."""

import asyncio

import pytest
from confluent_kafka import TopicPartition

from api.replies import HANDOFF, NoReplyPartition, ReplyHub


class Group:
    """What the hub's rebalance callbacks call on their consumer."""

    def __init__(self):
        self.assigned = []

    def assign(self, partitions):
        self.assigned = partitions

    def unassign(self):
        self.assigned = []

    def get_watermark_offsets(self, tp, timeout):
        return 0, 100 + tp.partition  # each partition's end now


async def test_a_revoked_partition_hands_its_streams_to_the_log_and_new_runs_go_elsewhere():
    hub = ReplyHub("127.0.0.1:1", "t")  # never connects: only the callbacks run here
    hub._loop = asyncio.get_running_loop()
    group = Group()
    with pytest.raises(NoReplyPartition):
        hub.pick()
    hub._assigned(group, [TopicPartition(f"t.{name}", p) for name in ("a", "b") for p in (0, 1)])
    assert hub.partitions == (0, 1) and {hub.pick(), hub.pick()} == {0, 1}
    assert [tp.offset for tp in group.assigned] == [100, 101, 100, 101]  # from each partition's end, as of now
    moved, stays = hub.open("run-1", 1), hub.open("run-0", 0)
    hub._revoked(group, [TopicPartition("t.a", 1), TopicPartition("t.b", 1)])
    await asyncio.sleep(0)  # the hand-over runs on the event loop
    assert hub.partitions == (0,) and hub.pick() == 0
    assert moved.overflowed and moved.queue.get_nowait().kind == HANDOFF
    assert not stays.overflowed and stays.queue.empty()
    hub._consumer.close()
