"""How every Kafka client of a process signs in: SASL_SSL with SCRAM-SHA-512 and the brokers' certificates
checked against the deployment's CA when the settings name a user (the local cluster profile, production), or
plaintext (the single-node stack). Users and their ACLs: infra/kafka_acls.py."""

from __future__ import annotations

from typing import Any

from runtime.settings import StackSettings

_security: dict[str, Any] | None = None


def security(settings: StackSettings) -> dict[str, Any]:
    """How a client signs in to Kafka under these settings: SASL_SSL with SCRAM-SHA-512 when a user is set,
    the brokers' certificates checked against the CA; nothing (plaintext) otherwise."""
    if not settings.kafka_username:
        return {}
    found = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": settings.kafka_username,
        "sasl.password": settings.kafka_password.get_secret_value(),
    }
    if settings.kafka_ca_file:
        found["ssl.ca.location"] = settings.kafka_ca_file
    return found


def secure(settings: StackSettings) -> None:
    """Sign every Kafka client of this process in as these settings say (a tool that builds its settings in
    code); a process started with PARLEY_* in its environment needs no call."""
    global _security
    _security = security(settings)


def client_config(bootstrap: str) -> dict[str, Any]:
    """Where the brokers are and how to sign in to them: what every client of this process starts from."""
    global _security
    if _security is None:
        _security = security(StackSettings())
    return {"bootstrap.servers": bootstrap, **_security}
