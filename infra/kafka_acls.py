"""A secured Kafka's users and what each may do, from the pipeline's own declarations (topics/pipeline.py): a
stage may write the topics it publishes to and their dead letters, and read the topics it consumes or reads,
nothing else. Every process of a stage signs in as the stage (SCRAM-SHA-512 over TLS); the schema registry as
`registry`, owning its topic; the stack's tools (topic creation, the CLI, the tests) as `admin`, the brokers'
super user (infra/local/kafka.sh). Consumer groups carry no data and are open to every user.

On a real cluster the operator grants the same (`bindings` lists them) against their own brokers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from topics.pipeline import PROCESSES, TOPICS, dead_letter_name, named

REGISTRY = "registry"


def users() -> tuple[str, ...]:
    """Every user a stack's processes sign in as."""
    return (*(p.name for p in PROCESSES), REGISTRY)


def user_of(service: str) -> str:
    """The user a local stack's process signs in as: `api-1` is `api`, `inference-small-1` is `inference`."""
    if service == "schema-registry":
        return REGISTRY
    return next(u for u in users() if service == u or service.startswith(f"{u}-"))


def bindings(namespace: str, registry_topic: str) -> list[AclBinding]:
    """What each user may do on a namespace's topics."""

    def allow(user: str, kind: ResourceType, name: str, operation: AclOperation) -> AclBinding:
        return AclBinding(
            kind,
            name,
            ResourcePatternType.LITERAL,
            f"User:{user}",
            "*",
            operation,
            AclPermissionType.ALLOW,
        )

    found: list[AclBinding] = []
    for topic in TOPICS:
        name = named(topic, namespace)
        for user in topic.producers:
            found.append(allow(user, ResourceType.TOPIC, name, AclOperation.WRITE))
        for user in {*topic.consumers, *topic.readers}:
            found.append(allow(user, ResourceType.TOPIC, name, AclOperation.READ))
            found.append(
                allow(
                    user, ResourceType.TOPIC, dead_letter_name(topic, namespace), AclOperation.WRITE
                )
            )
        for user in {*topic.producers, *topic.consumers, *topic.readers}:
            found.append(allow(user, ResourceType.TOPIC, name, AclOperation.DESCRIBE))
    found.append(
        allow(REGISTRY, ResourceType.TOPIC, registry_topic, AclOperation.ALL)
    )  # it creates it
    found += [allow(user, ResourceType.GROUP, "*", AclOperation.READ) for user in users()]
    return found


def _wait(futures: Mapping[Any, Future[Any]], what: str) -> None:
    for future in futures.values():
        try:
            future.result()
        except KafkaException as exc:
            raise RuntimeError(f"{what}: {exc}") from exc


def grant(
    admin: AdminClient, namespace: str, registry_topic: str, password: Callable[[str], str]
) -> int:
    """Make (or reset) every user's SCRAM credential and grant the namespace's ACLs; returns how many ACLs."""
    upserts: list[Any] = [
        UserScramCredentialUpsertion(
            user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), password(user).encode()
        )
        for user in users()
    ]
    _wait(admin.alter_user_scram_credentials(upserts), "SCRAM users")
    acls = bindings(namespace, registry_topic)
    _wait(admin.create_acls(acls), "ACLs")
    return len(acls)
