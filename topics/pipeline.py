"""The pipeline, declared once: every topic, its schema, its key, and which stages produce and consume it.

Reading this file top to bottom reads the data flow:
    api -> moderation -> scheduling -> inference -> (api, persistence, metering, memory)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from topics import events

# How a topic is partitioned. Conversation topics are keyed by chat_id and share one partition count along the
# path, so one chat's events stay in order on matching partitions. Reply topics are partitioned by edge replica
# instead: a run names the reply partition its edge replica reads (docs/decisions/0002-reply-partitions.md).
# Tables and status topics have one partition, read whole. The counts come from settings (Layout).
CHAT = "chat"
REPLY = "reply"
SINGLE = "single"

# How long the log keeps each kind of topic: a period of the settings (runtime/settings.py Periods, the same
# periods the tables apply; docs/privacy.md). A conversation's events (what `parley runs show`, `parley replay`
# and `parley export` read, docs/decisions/0014-topic-replay-and-evals.md) 30 days by default; the reply
# stream's deltas (bulky, and the answer is whole in RunCompleted) 7; the audit record 400.
# Tables are compacted (the latest record per key, until its key is deleted); pool status an hour.
EVENTS = "events"
STREAM = "stream"
AUDIT_KEPT = "audit"
KEPT = (EVENTS, STREAM, AUDIT_KEPT)
DAY_MS = 86_400_000


E = TypeVar("E")  # a topic's event type (topics/events.py)


@dataclass(frozen=True)
class Topic(Generic[E]):
    name: str
    event: type[E]  # its record type: what its producers publish and its consumers are handed
    producers: tuple[
        str, ...
    ]  # every stage that writes it: publishing from any other fails (UndeclaredPublish)
    # Every stage that consumes it (a consumer group, committing what it has handled) or, for a table, reads it
    # whole into memory: reading it from any other fails (UndeclaredConsume).
    consumers: tuple[str, ...]
    scale: str  # CHAT | REPLY | SINGLE
    key: str  # "chat_id", "reply_partition", or the row key of a table topic
    config: tuple[tuple[str, str], ...] = ()  # broker topic settings (a table topic is compacted)
    kept: str = (
        ""  # the period its records are kept (KEPT; Layout.retention_ms); "": its config says
    )
    # Stages that tail a stream topic's newest records outside any consumer group (no offsets, no lag to scale
    # on): the placement view reads the scheduled runs every scheduler replica places.
    readers: tuple[str, ...] = ()

    @property
    def schema(self) -> str:
        """The record type's name: its schema is schemas/<schema>.avsc."""
        return self.event.__name__

    @property
    def dead_letter(self) -> str:
        return f"{self.name}.dlq"


@dataclass(frozen=True)
class Layout:
    """How many partitions each kind of topic has and how many copies of each Kafka keeps, from settings
    (docs/decisions/0011-replicated-data-plane.md). The defaults are production's: three copies, two of which
    must have a record before it is acknowledged; 12 chat partitions (up to 12 consumers per pool and 12
    replicas per stage) and 32 reply partitions (up to 32 edge replicas). The single-node stack sets 1 and 1."""

    chat_partitions: int = 12
    reply_partitions: int = 32
    replication_factor: int = 3
    min_insync_replicas: int = 2
    # retention.ms of each period (KEPT); the settings' periods (runtime/settings.py), these their defaults
    retention_ms: tuple[tuple[str, int], ...] = (
        (EVENTS, 30 * DAY_MS),
        (STREAM, 7 * DAY_MS),
        (AUDIT_KEPT, 400 * DAY_MS),
    )

    def partitions(self, topic: Topic[Any]) -> int:
        return {CHAT: self.chat_partitions, REPLY: self.reply_partitions}.get(topic.scale, 1)

    def config(self, topic: Topic[Any] | None = None) -> dict[str, str]:
        """Broker settings of a topic (None: a dead-letter topic, whose poison records are a run's events):
        durability first, then its period, then the topic's own."""
        durable = {
            "min.insync.replicas": str(self.min_insync_replicas),
            "unclean.leader.election.enable": "false",
        }
        kept = topic.kept if topic else EVENTS
        period = {"retention.ms": str(dict(self.retention_ms)[kept])} if kept else {}
        return {**durable, **period, **dict(topic.config if topic else ())}


PROMPT_ACCEPTED = Topic(
    "chat.prompt-accepted.v1",
    events.PromptAccepted,
    ("api",),
    ("moderation", "persistence"),
    CHAT,
    "chat_id",
    kept=EVENTS,
)
PROMPT_MODERATED = Topic(
    "chat.prompt-moderated.v1",
    events.PromptModerated,
    ("moderation",),
    ("scheduling", "persistence"),
    CHAT,
    "chat_id",
    kept=EVENTS,
)
# Model pools: each has its own scheduled-runs topic, read by that pool's inference consumers as one group.
# Keyed by chat_id, so every turn of a chat lands on the partition (and so the consumer and engine) that
# holds its prompt prefix warm (docs/decisions/0005-inference-pools-and-takeover.md).
POOLS = ("small", "large")


def _scheduled(pool: str) -> Topic[events.RunScheduled]:
    name = f"chat.run-scheduled-{pool}.v1"
    return Topic(
        name,
        events.RunScheduled,
        ("scheduling", "memory"),
        ("inference",),
        CHAT,
        "chat_id",
        kept=EVENTS,
        readers=(
            "scheduling",
            "api",
        ),  # admission/placement.PoolView: runs placed that no status shows yet
    )


RUN_SCHEDULED = {pool: _scheduled(pool) for pool in POOLS}
RUN_REJECTED = Topic(
    "chat.run-rejected.v1",
    events.RunRejected,
    ("scheduling",),
    ("api", "persistence", "metering"),
    REPLY,
    "reply_partition",
    kept=EVENTS,  # how a run ended: history, not stream
)
# A run's reply stream: written by the inference consumer serving it, and opened by the scheduler's `queued`
# record (the admission the edge waits for before it starts the SSE stream).
TOKEN_DELTA = Topic(
    "chat.token-delta.v1",
    events.TokenDelta,
    ("inference", "scheduling"),
    ("api",),
    REPLY,
    "reply_partition",
    kept=STREAM,
    # a run's own records read back: where a consumer taking it over resumes, whether the edge was told it
    # is queued (runtime/reply_log.py)
    readers=("inference", "scheduling"),
)
RUN_COMPLETED = Topic(
    "chat.run-completed.v1",
    events.RunCompleted,
    ("inference",),
    ("persistence", "metering", "scheduling", "memory"),
    CHAT,
    "chat_id",
    kept=EVENTS,
)
# Edits, deletes and context resets of a chat's messages, and deleted chats: for the memory stage (which
# re-embeds, forgets and summarises again), for persistence (which erases a deleted chat's messages) and for
# metering (which keeps search in step, processors/search_index.py). The
# memory stage also writes RunScheduled itself: a summary is a run on the small pool
# (docs/decisions/0008-conversation-memory.md).
MEMORY_CHANGED = Topic(
    "chat.memory-changed.v1",
    events.MemoryChanged,
    ("api",),
    ("memory", "persistence", "metering"),
    CHAT,
    "chat_id",
    kept=EVENTS,
)
# Thumbs up/down on answers, from the chat frontend: kept in the log for evals, shown on the stored answer.
FEEDBACK = Topic(
    "chat.feedback.v1",
    events.Feedback,
    ("api",),
    ("persistence",),
    CHAT,
    "chat_id",
    kept=EVENTS,
)
# Commands to a running run (cancel). Every inference consumer reads all of it (no group): control events
# are rare, and only the consumer holding the run acts (docs/decisions/0004-cancel-and-openai-route.md).
RUN_CONTROL = Topic(
    "chat.run-control.v1",
    events.RunControl,
    ("api",),
    ("inference",),
    CHAT,
    "chat_id",
    kept=EVENTS,
)

# Tables: small keyed topics every replica reads whole and keeps in memory (latest record per key).
# Limits per tier and per user, set by admins at run time (docs/decisions/0006-admission-control.md). The
# edge writes it (admin routes) and also keeps a view of it to answer /v1/usage and the admin reads.
LIMITS = Topic(
    "admin.limits.v1",
    events.LimitsChanged,
    ("api",),
    ("scheduling", "inference", "api"),
    SINGLE,
    "tier:<name> | user:<id>",
    (("cleanup.policy", "compact"),),
)
# Safety policies per tier ('*': the default), set by admins at run time (docs/decisions/0007-safety.md). The
# edge writes it and reads it back for the admin routes.
SAFETY_POLICIES = Topic(
    "admin.safety-policies.v1",
    events.SafetyPolicy,
    ("api",),
    ("moderation", "scheduling", "inference", "api"),
    SINGLE,
    "<tier> | *",
    (("cleanup.policy", "compact"),),
)
# The MCP servers admins registered, with their tools and who may use them (docs/decisions/0028-mcp-tools.md).
# The edge writes it and offers the tools; the inference consumers call them.
TOOL_SERVERS = Topic(
    "admin.tool-servers.v1",
    events.ToolServer,
    ("api",),
    ("inference", "api"),
    SINGLE,
    "<server name>",
    (("cleanup.policy", "compact"),),
)
# Every person's data keys, wrapped by the key-encryption key (runtime/keys.py, topics/sealed.py): the edge
# makes a person's key before it writes their first record and deletes them (tombstones) when it erases the
# person; every process that reads or writes a person's text keeps the whole table. Compaction soon after a
# delete: the dirty segment rolls within an hour and a tombstone is itself gone a day later.
PERSON_KEYS = Topic(
    "keys.person-keys.v1",
    events.PersonKey,
    ("api",),
    ("api", "moderation", "scheduling", "inference", "persistence", "metering", "memory"),
    SINGLE,
    "<key_id>",
    (
        ("cleanup.policy", "compact"),
        ("segment.ms", str(3600_000)),
        ("min.cleanable.dirty.ratio", "0.01"),
        ("delete.retention.ms", str(86_400_000)),
    ),
)
# Each run's output moderation: every window checked, its scores, and the decision (a retraction or none).
OUTPUT_MODERATED = Topic(
    "chat.output-moderated.v1",
    events.OutputModerated,
    ("inference",),
    ("persistence",),
    CHAT,
    "chat_id",
    kept=EVENTS,
)
# Each inference consumer's load, every quarter second: what the scheduler's bounded queues and the edge's
# shedding at the door are measured by.
POOL_STATUS = Topic(
    "chat.pool-status.v1",
    events.PoolStatus,
    ("inference",),
    ("scheduling", "api"),
    SINGLE,
    "worker_id",
    (("retention.ms", str(3600_000)),),
)

# The audit record: every admin action and every read of another person's data, written by the edge before it
# answers (api/audit.py) and kept by the metering stage in ClickHouse, both for the audit period (by default 400
# days, longer than any conversation's events).
AUDIT = Topic(
    "admin.audit.v1",
    events.AuditEvent,
    ("api",),
    ("metering",),
    CHAT,
    "actor",
    kept=AUDIT_KEPT,
)

TOPICS: tuple[Topic[Any], ...] = (
    PROMPT_ACCEPTED,
    PROMPT_MODERATED,
    *RUN_SCHEDULED.values(),
    RUN_REJECTED,
    TOKEN_DELTA,
    RUN_COMPLETED,
    RUN_CONTROL,
    MEMORY_CHANGED,
    FEEDBACK,
    OUTPUT_MODERATED,
    LIMITS,
    SAFETY_POLICIES,
    TOOL_SERVERS,
    PERSON_KEYS,
    POOL_STATUS,
    AUDIT,
)


@dataclass(frozen=True)
class Process:
    """A deployable of the pipeline: the edge, a faust stage, or the inference consumers of a pool."""

    name: str
    module: str  # what `python -m` runs; a faust stage's module declares its HANDLERS and builds its deps
    port: int = 0  # a faust stage's own web server (health, /metrics), unless PARLEY_WEB_PORT says otherwise
    # more than one replica may run (metering with the embedded ClickHouse engine: one)
    scales: bool = True

    @property
    def consumes(self) -> tuple[Topic[Any], ...]:
        return tuple(t for t in TOPICS if self.name in t.consumers)

    @property
    def produces(self) -> tuple[Topic[Any], ...]:
        return tuple(t for t in TOPICS if self.name in t.producers)


# Every process, declared once: the CLI, the local stack, the chart's tests and the stages' entrypoint read it.
PROCESSES = (
    Process("api", "api"),
    Process("moderation", "processors.moderate_prompt", 6066),
    Process("scheduling", "processors.schedule_run", 6067),
    Process("inference", "inference"),
    Process("persistence", "processors.persist_turn", 6068),
    Process("metering", "processors.meter_usage", 6069, scales=False),
    Process("memory", "processors.remember", 6070),
)
STAGES = tuple(p.name for p in PROCESSES)
FAUST_STAGES = tuple(p.name for p in PROCESSES if p.port)


def process(name: str) -> Process:
    for p in PROCESSES:
        if p.name == name:
            return p
    raise KeyError(f"no process {name!r}; one of {', '.join(STAGES)}")


class UndeclaredPublish(RuntimeError):
    """A stage wrote to a topic the declaration above does not list it as a producer of."""


def check_publish(stage: str, topic: Topic[Any]) -> None:
    """Every publisher calls this before it sends: the declaration is the contract, not a comment."""
    if stage not in topic.producers:
        raise UndeclaredPublish(
            f"{stage} may not publish to {topic.name}: its producers are {topic.producers}"
        )


class UndeclaredConsume(RuntimeError):
    """A stage read a topic the declaration above does not list it as a consumer (or reader) of."""


def check_consume(stage: str, topic: Topic[Any], *, tailing: bool = False) -> None:
    """Every consumer and table view calls this before it reads; `tailing`: outside a consumer group."""
    allowed = topic.readers if tailing else topic.consumers
    if stage not in allowed:
        role = "readers" if tailing else "consumers"
        raise UndeclaredConsume(f"{stage} may not read {topic.name}: its {role} are {allowed}")


def named(topic: Topic[Any], namespace: str) -> str:
    """The topic's name on the broker: tests and parallel stacks run under their own namespace prefix."""
    return f"{namespace}.{topic.name}" if namespace else topic.name


def dead_letter_name(topic: Topic[Any], namespace: str) -> str:
    return f"{named(topic, namespace)}.dlq"
