"""What a stack's topology tells its processes and its nodes: copies, majorities, addresses, ring tokens."""

import json

import pytest

from infra.stack import Stack
from infra.topology import CLUSTER, SINGLE_NODE


def test_the_single_node_stack_says_one_copy_in_its_settings():
    env = next(s for s in Stack(namespace="t1").services() if s.name == "schema-registry").env
    assert env["PARLEY_KAFKA_REPLICATION_FACTOR"] == "1" and env["PARLEY_KAFKA_MIN_INSYNC_REPLICAS"] == "1"
    assert json.loads(env["PARLEY_CASSANDRA_REPLICATION"]) == {"datacenter1": 1}
    settings = Stack(namespace="t1").settings
    assert settings.layout.replication_factor == 1 and settings.cassandra.replication == {"datacenter1": 1}
    assert SINGLE_NODE.kafka_bootstrap == "127.0.0.1:9092"


def test_the_cluster_keeps_three_copies_and_needs_two():
    stack = Stack(namespace="t1", topology=CLUSTER)
    env = {s.name: s.env for s in stack.services()}["api-0"]
    assert env["PARLEY_KAFKA_BOOTSTRAP"] == "127.0.0.11:9092,127.0.0.12:9092,127.0.0.13:9092"
    assert env["PARLEY_CASSANDRA_HOSTS"] == "127.0.0.11,127.0.0.12,127.0.0.13"
    settings = stack.settings
    assert (settings.layout.replication_factor, settings.layout.min_insync_replicas) == (3, 2)
    assert settings.cassandra.replication == {"datacenter1": 3} and settings.cassandra.consistency == "LOCAL_QUORUM"


def test_cluster_nodes_share_one_quorum_and_an_even_ring(tmp_path):
    brokers = CLUSTER.brokers(tmp_path)
    assert [b.index for b in brokers] == [1, 2, 3]
    assert {b.env["KAFKA_VOTERS"] for b in brokers} == {"1@127.0.0.11:9093,2@127.0.0.12:9093,3@127.0.0.13:9093"}
    assert len({b.env["KAFKA_CLUSTER_ID"] for b in brokers}) == 1 and len({b.env["KAFKA_NAME"] for b in brokers}) == 3
    assert CLUSTER.brokers(tmp_path)[0].env["KAFKA_CLUSTER_ID"] == brokers[0].env["KAFKA_CLUSTER_ID"]  # made once
    tokens = [int(n.env["CASSANDRA_INITIAL_TOKEN"]) for n in CLUSTER.cassandra_nodes(tmp_path)]
    gaps = {b - a for a, b in zip(tokens, tokens[1:] + [tokens[0] + 2**64], strict=True)}
    assert tokens[0] == -(2**63) and max(gaps) - min(gaps) <= 2
    assert {n.env["CASSANDRA_SEEDS"] for n in CLUSTER.cassandra_nodes(tmp_path)} == {"127.0.0.11"}


def test_status_lists_every_process_with_its_role_address_and_broker_id(capsys, tmp_path, monkeypatch):
    from infra.cli import main

    monkeypatch.setenv("LOCAL_INFRA_STATE", str(tmp_path))  # nothing runs there
    main(["status", "--cluster", "--json", "--port-base", "47000"])
    rows = json.loads(capsys.readouterr().out)
    roles = {}
    for row in rows:
        assert {"name", "role", "pid", "address"} <= set(row) and row["pid"] is None
        roles.setdefault(row["role"], []).append(row)
    assert [r["broker_id"] for r in roles["kafka-broker"]] == [1, 2, 3]
    assert [r["address"] for r in roles["cassandra-node"]] == [f"127.0.0.1{i}:9042" for i in (1, 2, 3)]
    assert len(roles["edge"]) == 2 and len(roles["inference"]) == len(roles["engine"]) == 4
    assert len(roles["schema-registry"]) == 1 and len(roles["stage"]) == 5


def test_a_stack_without_a_namespace_is_never_forgotten():
    with pytest.raises(ValueError, match="default namespace"):
        Stack().forget()  # would drop the deployment's own keyspace and topics
