"""The cluster profile's transport is encrypted and authenticated (infra/certs.py, infra/kafka_acls.py): Kafka takes
only SCRAM users over TLS and lets each stage read and write only its own topics; Cassandra takes only its role
over TLS; a wrong password or certificate is refused; and no password reaches a log. The failover tests in
tests/cluster/test_failover.py run over this same transport."""

from __future__ import annotations

import ssl
import time

import pytest
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import Cluster as CqlCluster
from cassandra.cluster import NoHostAvailable
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from infra.topology import CLUSTER
from storage.session import tls
from topics.pipeline import PROMPT_ACCEPTED, RUN_CONTROL


def as_user(cluster, user: str, password: str | None = None, **extra: object) -> dict:
    secured = CLUSTER.secrets(cluster.stack.state)
    return cluster.kafka(
        **{"sasl.username": user, "sasl.password": password or secured.password(f"kafka-{user}"), **extra}
    )


def test_kafka_takes_only_its_users_over_tls_and_each_stage_only_its_topics(cluster):
    plaintext = AdminClient({"bootstrap.servers": CLUSTER.kafka_bootstrap, "socket.timeout.ms": 3000})
    with pytest.raises(KafkaException):
        plaintext.list_topics(timeout=5)
    wrong = AdminClient(as_user(cluster, "api", "not-the-password"))
    with pytest.raises(KafkaException):
        wrong.list_topics(timeout=5)
    untrusted = AdminClient({**as_user(cluster, "api"), "ssl.ca.location": ssl.get_default_verify_paths().cafile})
    with pytest.raises(KafkaException):
        untrusted.list_topics(timeout=5)

    # the memory stage may not write prompts (only the edge does) ...
    failed: list[KafkaError | None] = []
    producer = Producer(as_user(cluster, "memory", **{"delivery.timeout.ms": 10_000}))
    producer.produce(cluster.topic(PROMPT_ACCEPTED), b"not a prompt", on_delivery=lambda e, _m: failed.append(e))
    producer.flush(15)
    assert failed and failed[0] is not None and failed[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    # ... nor even see the edge's orders to the inference consumers, which the inference stage reads
    def seen_by(user: str) -> KafkaError | None:
        reader = Consumer(as_user(cluster, user, **{"group.id": f"t-{time.time()}"}))
        try:
            name = cluster.topic(RUN_CONTROL)
            return reader.list_topics(name, timeout=10).topics[name].error
        finally:
            reader.close()

    assert seen_by("inference") is None
    refused = seen_by("memory")
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_cassandra_takes_only_its_role_over_tls_and_no_password_reaches_a_log(cluster):
    settings = cluster.stack.settings.cassandra
    ours, wrong = PlainTextAuthProvider(settings.username, settings.password), PlainTextAuthProvider("parley", "no")
    public = tls(ssl.get_default_verify_paths().cafile)  # the system's CAs: not the one that signed the nodes
    attempts = [
        {},  # plaintext
        {"auth_provider": wrong, "ssl_context": tls(settings.ca_file)},
        {"auth_provider": ours, "ssl_context": public},
    ]
    for extra in attempts:
        with pytest.raises(NoHostAvailable):
            CqlCluster(["127.0.0.11"], protocol_version=5, connect_timeout=5, **extra).connect()
    session = cluster.cql("127.0.0.11")
    try:
        roles = {r.role: r.can_login for r in session.execute("SELECT role, can_login FROM system_auth.roles")}
        assert roles == {"parley": True, "cassandra": False}  # the built-in superuser is locked
    finally:
        session.cluster.shutdown()

    secured = CLUSTER.secrets(cluster.stack.state)
    secrets = [settings.password, secured.password("kafka-admin"), secured.password("keystore")]
    secrets += [secured.password(f"kafka-{u}") for u in ("api", "inference", "scheduling", "registry")]
    logs = [p for p in cluster.stack.state.rglob("*") if p.is_file() and p.suffix in (".log", ".out")]
    logs = [p for p in logs if "cluster" in p.parts or cluster.stack.tag in p.parts]
    assert logs
    leaked = [str(p) for p in logs for s in secrets if s in p.read_text(errors="replace")]
    assert not leaked, leaked
