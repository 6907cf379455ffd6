"""A replay's candidate configuration and the namespace it runs in, beside production.

The namespace `<production>-replay-<id>` has its own topics and consumer groups, and for a whole-pipeline
replay its own Cassandra keyspace, seeded with the selected chats' rows as they stood (so context assembly,
summaries and recall see what production saw). Its policy and limits tables start as copies of production's,
with the candidate's on top. Its processes are the production code (`infra.stack.Stack`, started by the CLI;
only the services a replay needs) with the candidate's settings in their environment. Nothing here writes to
production.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from admission.limits import DEFAULT_TIERS, Limits, change, row_key
from runtime.kafka import Publisher, delete_topics, ensure_topics
from runtime.keys import Keyring
from runtime.settings import StackSettings
from runtime.window import Read, Window
from safety.policy import ANY_TIER, Policy, to_record
from storage.ids import id_time_ms
from topics.events import PersonKey, PromptAccepted
from topics.pipeline import LIMITS, PERSON_KEYS, POOLS, SAFETY_POLICIES

THROUGH = ("moderation", "pipeline")
SEEDED = (
    "chats",
    "runs",
    "messages",
    "summaries",
    "memory",
)  # a chat's rows, copied into a replay's keyspace


class CandidateError(ValueError):
    pass


@dataclass(frozen=True)
class Candidate:
    """What a replay changes. Settings are PARLEY_* names without the prefix (system_prompt, recall_k, pools, ...)."""

    through: str = "moderation"
    policy: dict[str, Any] | None = None  # a safety policy for every tier
    limits: dict[str, Any] | None = None  # {"tiers": {tier: fields}, "users": {user: fields}}
    settings: dict[str, str] = field(default_factory=dict)
    model: str | None = None  # every prompt asks for this model (a pool's model id)
    temperature: float | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.through not in THROUGH:
            raise CandidateError(f"--through is one of {', '.join(THROUGH)}")
        if self.through == "moderation" and (
            self.limits or self.settings or self.model or self.max_tokens
        ):
            raise CandidateError(
                "limits, settings, model and sampling act past moderation: use --through pipeline"
            )
        if self.temperature is not None and self.through == "moderation":
            raise CandidateError("sampling acts past moderation: use --through pipeline")
        if (
            not any((self.policy, self.limits, self.settings, self.model, self.max_tokens))
            and self.temperature is None
        ):
            raise CandidateError(
                "say what to change: --policy, --limits, --set KEY=VALUE, --system-prompt, --model/--pool, "
                "--temperature or --max-tokens"
            )

    def prompt(self, recorded: PromptAccepted) -> PromptAccepted:
        """The recorded prompt as the candidate sends it (pure): same ids, the candidate's model and sampling."""
        out: PromptAccepted = {**recorded}
        if self.model is not None:
            out = {**out, "model": self.model}
        if self.temperature is not None:
            out = {**out, "temperature": self.temperature}
        if self.max_tokens is not None:
            out = {**out, "max_tokens": self.max_tokens}
        return out

    def environment(self) -> dict[str, str]:
        return {f"PARLEY_{k.upper()}": v for k, v in self.settings.items()}

    def describe(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, {}, "")}


def load_json(path: str, what: str) -> dict[str, Any]:
    try:
        found = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CandidateError(f"no {what} file {path}") from None
    except json.JSONDecodeError as exc:
        raise CandidateError(f"{path} is not JSON: {exc}") from None
    if not isinstance(found, dict):
        raise CandidateError(f"{path} is not a {what} (a JSON object)")
    return found


def load_policy(path: str) -> dict[str, Any]:
    """A policy file (the body of PUT /v1/admin/safety/policies/{tier}), checked."""
    body = load_json(path, "policy")
    try:
        return Policy(**body).model_dump()
    except (TypeError, ValueError) as exc:
        raise CandidateError(
            f"{path} is not a policy ({{version, rules, on_error}}): {exc}"
        ) from None


def load_limits(path: str) -> dict[str, Any]:
    """A limits file: {"tiers": {"free": {"max_concurrent": 1, ...}}, "users": {"alice": {...}}}, checked."""
    body = load_json(path, "limits")
    if set(body) - {"tiers", "users"} or not body:
        raise CandidateError(f"{path}: a limits file has 'tiers' and/or 'users'")
    for scope in body.values():
        for name, fields in scope.items():
            unknown = set(fields) - set(Limits.model_fields)
            try:
                if unknown:
                    raise ValueError(
                        f"unknown fields {sorted(unknown)}; known: {', '.join(Limits.model_fields)}"
                    )
                Limits(
                    **{**DEFAULT_TIERS["pro"].model_dump(), **fields}
                )  # the fields named, type-checked
            except (TypeError, ValueError) as exc:
                raise CandidateError(f"{path}: limits of {name!r}: {exc}") from None
    return body


def setting(text: str) -> tuple[str, str]:
    """'recall_k=3' -> ('recall_k', '3'), checked against the settings the stages read."""
    from processors.settings import ProcessorSettings

    name, sep, value = text.partition("=")
    if not sep or name not in ProcessorSettings.model_fields:
        raise CandidateError(f"--set takes KEY=VALUE with KEY a stage setting, got {text!r}")
    return name, value


def publish_tables(settings: StackSettings, namespace: str, candidate: Candidate) -> None:
    """The replay's policy and limits tables (production's rows, then the candidate's on top) and people's data
    keys, so its stages open the text of the records it replays."""
    producer = Publisher(
        settings.kafka_bootstrap, "api", namespace
    )  # the replay writes what the edge would
    with Window(settings.kafka_bootstrap, settings.namespace) as window:
        rows = list(window.read([Read(SAFETY_POLICIES, 0, 2**62), Read(LIMITS, 0, 2**62)]))
    for row in rows:
        producer.publish(row.topic, row.event, key=row.key)
    if settings.seal_text:  # people's data keys as they stand now (an erased person's stay deleted)
        keys = Keyring(settings.kafka_bootstrap, settings.namespace, "api", settings.kek_value())
        keys.start()
        for key_id, record in keys.rows().items():
            producer.publish(PERSON_KEYS, cast(PersonKey, record), key=key_id)
        keys.stop()
    if candidate.policy is not None:
        policy = to_record(ANY_TIER, Policy(**candidate.policy), "replay")
        producer.publish(SAFETY_POLICIES, policy, key=ANY_TIER)
        for row in rows:  # a tier's own production policy would shadow the candidate's '*'
            if row.topic is SAFETY_POLICIES and row.key and row.key.decode() != ANY_TIER:
                tiered = to_record(row.key.decode(), Policy(**candidate.policy), "replay")
                producer.publish(SAFETY_POLICIES, tiered, key=row.key)
    for scope, names in (candidate.limits or {}).items():
        for name, fields in names.items():
            kind = scope.rstrip("s")  # tiers -> tier, users -> user
            producer.publish(LIMITS, change(kind, name, fields, "replay"), key=row_key(kind, name))
    if producer.flush(30):
        raise CandidateError("could not write the replay's tables")


def prepare(
    settings: StackSettings,
    namespace: str,
    candidate: Candidate,
    chats: dict[str, int],
    replayed: set[str],
) -> None:
    """Topics, tables and (whole pipeline) the keyspace seeded with each chat's rows up to the given time
    (epoch ms: the chat's latest selected run)."""
    ensure_topics(settings.kafka_bootstrap, namespace, settings.layout)
    publish_tables(settings, namespace, candidate)
    if candidate.through == "pipeline":
        seed(settings, replay_settings(settings, namespace), chats, replayed)


def replay_settings(settings: StackSettings, namespace: str) -> StackSettings:
    return settings.model_copy(update={"namespace": namespace})


def seed(
    production: StackSettings, replay: StackSettings, chats: dict[str, int], replayed: set[str]
) -> None:
    """Copy each chat's rows into the replay's keyspace (migrated first), as they stood at its time: no row
    written after it, and runs not yet finished (the replay serves them again)."""
    from storage.schema import migrate
    from storage.session import connect_session

    migrate(replay.cassandra)
    session = connect_session(production.cassandra)
    try:
        for table in SEEDED:
            insert = None
            for chat_id, until_ms in chats.items():
                rows = session.execute(
                    f"SELECT * FROM {production.keyspace_name}.{table} WHERE chat_id = %s",
                    (uuid.UUID(chat_id),),
                )
                for row in rows:
                    values = row._asdict()
                    if not _before(table, values, until_ms):
                        continue
                    if table == "runs" and str(values["run_id"]) in replayed:
                        values["finish_reason"] = None  # a run replayed here is served again
                    if insert is None:
                        columns = ", ".join(values)
                        marks = ", ".join("?" for _ in values)
                        insert = session.prepare(
                            f"INSERT INTO {replay.keyspace_name}.{table} ({columns}) VALUES ({marks})"
                        )
                    session.execute(insert, list(values.values()))
    finally:
        session.cluster.shutdown()


def _before(table: str, row: dict[str, Any], until_ms: int) -> bool:
    """Whether a row existed before the chat's latest selected run was answered (its answer excluded)."""
    if table in ("messages", "memory"):
        return id_time_ms(row["message_id"]) < until_ms  # a timeuuid column
    if table == "summaries":
        created = row.get("created_at")
        return created is None or created.timestamp() * 1000 < until_ms
    return True


@dataclass(frozen=True)
class Processes:
    """Which production processes a candidate runs, and how: what infra.stack.Stack takes (the caller, the CLI,
    starts them: this package does not run processes itself)."""

    namespace: str
    port_base: int
    only: tuple[str, ...]
    registry: str
    overrides: dict[str, str]


class Running(Protocol):
    @property
    def api_url(self) -> str: ...

    def start(self) -> None: ...
    def wait_ready(self) -> None: ...
    def stop(self) -> None: ...


Launch = Callable[[Processes], Running]


def processes(
    settings: StackSettings,
    namespace: str,
    candidate: Candidate,
    port_base: int,
    serving: bool = False,
) -> Processes:
    """The candidate's processes: the moderation stage, and for the whole pipeline the scheduler and one
    inference consumer (with its engine) per pool. A replay stores nothing, so persistence, metering and
    memory do not run. `serving` (an eval under a candidate): an edge, persistence and memory too, so a
    conversation of several turns is kept and remembered in the candidate's keyspace."""
    only: tuple[str, ...] = ("moderation",)
    if candidate.through == "pipeline":
        only += ("scheduling", *(f"inference-{pool}-0" for pool in POOLS))
    if serving:
        only += ("persistence", "memory", "api-0")
    # The CLI's own connection and durability settings (PARLEY_* where it runs: a laptop's stack or a pod on
    # a cluster), over the local stack's defaults, then the candidate's.
    connection = {
        "PARLEY_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "PARLEY_KAFKA_REPLICATION_FACTOR": str(settings.kafka_replication_factor),
        "PARLEY_KAFKA_MIN_INSYNC_REPLICAS": str(settings.kafka_min_insync_replicas),
        "PARLEY_CHAT_PARTITIONS": str(settings.chat_partitions),
        "PARLEY_REPLY_PARTITIONS": str(settings.reply_partitions),
        "PARLEY_CASSANDRA_HOSTS": settings.cassandra_hosts,
        "PARLEY_CASSANDRA_PORT": str(settings.cassandra_port),
        "PARLEY_CASSANDRA_REPLICATION": json.dumps(settings.cassandra_replication),
        "PARLEY_CASSANDRA_CONSISTENCY": settings.cassandra_consistency,
    }
    overrides = {**connection, "OTEL_TRACES_EXPORTER": "none", **candidate.environment()}
    return Processes(namespace, port_base, only, settings.schema_registry_url, overrides)


def drop(settings: StackSettings, namespace: str, keyspace: bool) -> None:
    """A candidate namespace's topics and (whole pipeline) keyspace."""
    from storage.schema import drop_keyspace

    delete_topics(settings.kafka_bootstrap, namespace)
    if keyspace:
        drop_keyspace(replay_settings(settings, namespace).cassandra)
