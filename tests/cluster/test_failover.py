"""Failover on a 3-broker, 3-node cluster while answers stream: every accepted message is answered and stored
exactly once, every stream reaches run.completed (resuming with Last-Event-ID where it broke) with no gap and
no duplicate, usage rows equal the runs, no stage stays down, and the dead broker or node rejoins."""

from __future__ import annotations

import os
import signal
import time

import httpx

from topics import codec
from topics.pipeline import POOL_STATUS, RUN_COMPLETED, TOKEN_DELTA, TOPICS

from .conftest import PORT_BASE, Traffic, wait_for


def offsets(stream):
    return [int(e["id"].split(":")[2]) for e in stream.events]


def check_every_turn(cluster, streams):
    """Exactly once, end to end, for every turn the traffic sent."""
    assert streams
    for stream in streams:
        assert stream.error is None, stream.error
        assert stream.completed, f"run {stream.run_id} ended {stream.events[-1:]}"
        assert offsets(stream) == sorted(set(offsets(stream))), "no duplicate, in log order"
        client = cluster.client(stream.token)

        def stored():
            data = client.get(f"/v1/chats/{stream.chat_id}/messages").json()["data"]
            return data if len(data) == 2 and data[1]["content"] == stream.text else None

        messages = wait_for(stored, 60)
        assert messages, client.get(f"/v1/chats/{stream.chat_id}/messages").json()["data"]
        assert [m["role"] for m in messages] == ["user", "assistant"] and messages[1]["id"] == stream.run_id
        metering = f"http://127.0.0.1:{PORT_BASE + 13}/usage-rows/{stream.run_id}"
        internal = cluster.stack.settings.internal_headers()
        rows = wait_for(lambda: client.get(metering, headers=internal).json()["data"], 60)
        assert len(rows) == 1, rows
        usage = stream.events[-1]["data"]["usage"]
        assert int(rows[0]["completion_tokens"]) == usage["completion_tokens"]
    assert wait_for(lambda: not cluster.stages_alive(), 30), f"down: {cluster.stages_alive()}"


def test_topics_and_keyspace_keep_three_copies(cluster):
    admin = cluster.admin()
    names = [cluster.topic(t) for t in TOPICS]
    meta = admin.list_topics(timeout=10).topics
    for name in names + [f"{n}.dlq" for n in names] + ["__consumer_offsets"]:
        assert all(len(p.replicas) == 3 for p in meta[name].partitions.values()), name
    from confluent_kafka.admin import ConfigResource

    resource = ConfigResource(ConfigResource.Type.TOPIC, cluster.topic(TOKEN_DELTA))
    config = next(iter(admin.describe_configs([resource]).values())).result()
    assert config["min.insync.replicas"].value == "2"
    assert config["unclean.leader.election.enable"].value == "false"
    assert len(meta[cluster.topic(TOKEN_DELTA)].partitions) == cluster.stack.settings.reply_partitions
    assert len(meta[cluster.topic(RUN_COMPLETED)].partitions) == cluster.stack.settings.chat_partitions
    session = cluster.cql("127.0.0.11")
    try:
        keyspace = cluster.stack.settings.keyspace_name
        row = session.execute("SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = %s", (keyspace,))
        replication = dict(row.one().replication)
        assert replication["class"].endswith("NetworkTopologyStrategy") and replication["datacenter1"] == "3"
        assert len(list(session.execute("SELECT peer FROM system.peers_v2"))) == 2
    finally:
        session.cluster.shutdown()


def test_killing_the_leader_broker_mid_answer_loses_nothing(cluster):
    replies = cluster.topic(TOKEN_DELTA)
    leader = cluster.leader(replies, 0)  # edge 0 reads reply partition 0: the streams' own path
    node = cluster.broker(leader)
    try:
        with Traffic(cluster) as traffic:
            traffic.flowing()
            killed_at = time.monotonic()
            os.kill(node.pid(), signal.SIGKILL)
            assert wait_for(lambda: traffic.first_token_after(killed_at), 120), "no token after the kill"
            time.sleep(3)  # more turns start while the broker is down
            print(f"kill -9 of broker {leader} to the next token: {traffic.first_token_after(killed_at):.3f} s")
        assert cluster.leader(replies, 0) != leader
        check_every_turn(cluster, traffic.streams)
    finally:
        node.sh("start")  # a failure above must not leave the tests after it a broker short
    assert wait_for(lambda: cluster.in_sync(), 120), "the broker did not rejoin every partition"


def test_killing_a_cassandra_node_loses_no_stored_message(cluster):
    node = cluster.cassandra(2)
    try:
        with Traffic(cluster) as traffic:
            traffic.flowing()
            os.kill(node.pid(), signal.SIGKILL)
            time.sleep(8)  # turns are started, answered and stored while the node is down
        check_every_turn(cluster, traffic.streams)
    finally:
        node.sh("start")  # a failure above must not leave the tests after it a node short
    session = cluster.cql(node.host)  # ask the restarted node itself
    try:
        peers = {str(r.peer) for r in session.execute("SELECT peer FROM system.peers_v2")}
        assert peers == {"127.0.0.11", "127.0.0.13"}
    finally:
        session.cluster.shutdown()


def test_a_rolling_restart_of_every_broker_loses_nothing(cluster):
    with Traffic(cluster) as traffic:
        traffic.flowing()
        for broker in cluster.stack.topology.brokers(cluster.stack.state):
            broker.sh("stop")
            broker.sh("start")
            assert wait_for(lambda: cluster.in_sync(), 120), (
                f"broker {broker.index} did not rejoin: {cluster.out_of_sync()}"
            )
    check_every_turn(cluster, traffic.streams)
    assert len(traffic.streams) >= 6


def test_partitions_grow_on_a_running_system(cluster, monkeypatch):
    """`parley topics grow`, then the processes restarted with the new counts: every partition is read, and
    chats whose key now lands on a new partition are answered."""
    from infra.cli import main as parley

    settings = cluster.stack.settings
    chat, reply = settings.chat_partitions + 4, settings.reply_partitions + 8
    parley(
        ["topics", "grow", "--cluster", "--namespace", cluster.namespace, "--chat", str(chat), "--reply", str(reply)]
    )
    meta = cluster.admin().list_topics(timeout=10).topics
    for topic in TOPICS:
        want = {"chat": chat, "reply": reply, "single": 1}[topic.scale]
        assert len(meta[cluster.topic(topic)].partitions) == want, topic.name
    monkeypatch.setenv("PARLEY_CHAT_PARTITIONS", str(chat))
    monkeypatch.setenv("PARLEY_REPLY_PARTITIONS", str(reply))
    cluster.stack.stop()
    cluster.stack.start()
    cluster.stack.wait_ready()
    held = [httpx.get(f"http://127.0.0.1:{PORT_BASE + 100 * r}/readyz").json()["reply_partitions"] for r in (0, 1)]
    assert sorted(held[0] + held[1]) == list(range(reply)), "every reply partition is held by one edge"
    for pool in ("small", "large"):  # each pool's consumers, together, read every scheduled-runs partition now
        read = wait_for(lambda p=pool: set().union(*pool_partitions(cluster, p).values()) == set(range(chat)), 60)
        assert read, pool_partitions(cluster, pool)
    with Traffic(cluster, concurrency=4, prompt="Say hello in one short sentence.") as traffic:
        wait_for(lambda: sum(s.completed for s in traffic.streams) >= 12, 240)
    check_every_turn(cluster, traffic.streams)


def pool_partitions(cluster, pool: str) -> dict[str, set[int]]:
    """Each consumer of a pool: the scheduled-runs partitions its latest status (of the last 3 s) says it reads."""
    from confluent_kafka import Consumer, TopicPartition

    name = cluster.topic(POOL_STATUS)
    consumer = Consumer(cluster.kafka(**{"group.id": f"t-{time.time()}"}))
    try:
        since = int(time.time() * 1000) - 3000
        [start] = consumer.offsets_for_times([TopicPartition(name, 0, since)], timeout=10)
        consumer.assign([start])
        latest: dict[str, set[int]] = {}
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            status = codec.decode("PoolStatus", msg.value())
            if status["pool"] == pool:
                latest[status["worker_id"]] = set(status["partitions"])
        return latest
    finally:
        consumer.close()
