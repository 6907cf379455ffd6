"""The secured transport's pieces on their own (the cluster running over them: tests/cluster/test_secured.py): each
stage's Kafka ACLs are exactly what the pipeline declares, the clients' sign-in follows the settings, and the
local cluster's certificate names every node and loads as the brokers and nodes read it."""

from __future__ import annotations

import ipaddress

from confluent_kafka.admin import AclOperation, ResourceType
from cryptography import x509
from cryptography.hazmat.primitives.serialization import pkcs12
from pydantic import SecretStr

from infra import certs, kafka_acls
from runtime.kafka_auth import security
from runtime.settings import StackSettings
from topics.pipeline import PERSON_KEYS, PROMPT_ACCEPTED, RUN_CONTROL, TOKEN_DELTA, TOPICS, named


def granted(user: str) -> set[tuple[str, AclOperation]]:
    return {
        (b.name, b.operation)
        for b in kafka_acls.bindings("ns", "_schemas")
        if b.principal == f"User:{user}" and b.restype == ResourceType.TOPIC
    }


def test_each_stage_may_write_what_it_publishes_and_read_what_it_consumes_and_nothing_else():
    prompts, control = named(PROMPT_ACCEPTED, "ns"), named(RUN_CONTROL, "ns")
    assert (prompts, AclOperation.WRITE) in granted("api") and (prompts, AclOperation.WRITE) not in granted("memory")
    assert (control, AclOperation.READ) in granted("inference")
    assert not {name for name, _ in granted("memory")} & {control}
    for reader in ("inference", "scheduling"):  # a run's own records read back at a takeover, or to see it queued
        assert (named(TOKEN_DELTA, "ns"), AclOperation.READ) in granted(reader)
    assert (f"{named(RUN_CONTROL, 'ns')}.dlq", AclOperation.WRITE) in granted("inference")  # its poison records
    for user in kafka_acls.users():
        if user == kafka_acls.REGISTRY:
            assert granted(user) == {("_schemas", AclOperation.ALL)}
            continue
        writes = {n for n, op in granted(user) if op == AclOperation.WRITE and not n.endswith(".dlq")}
        reads = {n for n, op in granted(user) if op == AclOperation.READ}
        assert writes == {named(t, "ns") for t in TOPICS if user in t.producers}, user
        assert reads == {named(t, "ns") for t in TOPICS if user in (*t.consumers, *t.readers)}, user
        assert named(PERSON_KEYS, "ns") in reads  # every stage handles someone's text
    assert [kafka_acls.user_of(s) for s in ("api-1", "inference-small-0", "moderation", "schema-registry")] == [
        "api",
        "inference",
        "moderation",
        "registry",
    ]


def test_a_client_signs_in_only_when_a_user_is_set():
    assert security(StackSettings(kafka_username="")) == {}
    signed = security(StackSettings(kafka_username="api", kafka_password=SecretStr("pw"), kafka_ca_file="/run/ca.pem"))
    assert signed == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "api",
        "sasl.password": "pw",
        "ssl.ca.location": "/run/ca.pem",
    }


def test_the_cluster_certificate_names_every_node_and_its_keystore_opens(tmp_path):
    hosts = ("127.0.0.11", "127.0.0.12", "127.0.0.13")
    made = certs.ensure(tmp_path / "secrets", hosts)
    assert certs.ensure(tmp_path / "secrets", hosts).node_p12.read_bytes() == made.node_p12.read_bytes()  # once
    key, cert, chain = pkcs12.load_key_and_certificates(made.node_p12.read_bytes(), made.password("keystore").encode())
    assert key is not None and cert is not None and len(chain) == 1
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.IPAddress)) == {ipaddress.ip_address(h) for h in hosts}
    ca = x509.load_pem_x509_certificate(made.ca.read_bytes())
    cert.verify_directly_issued_by(ca)
    assert made.password("kafka-api") == made.password("kafka-api") != made.password("kafka-memory")
    assert (tmp_path / "secrets").stat().st_mode & 0o077 == 0 and made.node_pem.stat().st_mode & 0o077 == 0
