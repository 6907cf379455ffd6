"""Settings every deployable shares: where Kafka is and which namespace the stack runs under."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from topics.pipeline import KEPT, Layout

REPO_ROOT = Path(__file__).resolve().parent.parent


def state_dir() -> Path:
    import os

    return Path(os.environ.get("LOCAL_INFRA_STATE", REPO_ROOT / ".local-infra"))


def local_jwt_secret() -> SecretStr:
    """The local stack's signing key: made once, kept in the state folder, shared by the CLI and the edge."""
    return local_secret("jwt-secret")


def local_internal_token() -> SecretStr:
    """The local stack's credential for its internal endpoints (the stages' own pages): kept like the JWT key."""
    return local_secret("internal-token")


def local_kek(directory: Path) -> Path:
    """The local stack's key-encryption key (a file its processes read, PARLEY_KEK_FILE): made once."""
    local_secret("kek", directory)
    return directory / "kek"


def local_secret(name: str, directory: Path | None = None) -> SecretStr:
    """A secret made by whichever process asks first; processes starting at once all end up with that one."""
    import os

    path = (directory or state_dir()) / name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        draft = path.with_name(f".{name}.{os.getpid()}")
        draft.touch(mode=0o600)  # private before the secret is in it
        draft.write_text(secrets.token_urlsafe(32))
        try:
            os.link(draft, path)  # atomic: fails if another process made it first
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return SecretStr(path.read_text().strip())


class Pool(BaseModel):
    """A model pool: the model id it serves, how many tokens (prompt + answer) one sequence may hold, the
    budget a chat's assembled prompt is fitted into (docs/decisions/0008-conversation-memory.md) and where its
    tokenizer comes from (conversation/tokens.py: gguf:PATH, or hf:DIR for a Hugging Face model folder)."""

    model_config = {"frozen": True}

    model: str
    context: int
    prompt_budget: int = 0  # 0: three quarters of the context
    tokenizer: str = "gguf:"  # the bundled SmolLM2 GGUF
    description: str = ""  # what the model picker says of it

    @property
    def budget(self) -> int:
        return self.prompt_budget or self.context * 3 // 4


# Locally both pools run SmolLM2-135M under llama.cpp, as two engine configurations: many short sequences,
# or few long ones (the model's own limit is 8,192 tokens). On GPUs they are different models.
DEFAULT_POOLS = {
    "small": Pool(
        model="smollm2-135m-instruct",
        context=2048,
        prompt_budget=1536,
        description="Quick answers to short chats",
    ),
    "large": Pool(
        model="smollm2-135m-instruct-8k",
        context=8192,
        prompt_budget=4096,
        description="Long chats and long pastes",
    ),
}


DAY_S = 86_400


@dataclass(frozen=True)
class Periods:
    """How long each kind of data is kept, in days (0: until it is deleted): the one set of periods the log, the
    Cassandra tables and the ClickHouse tables apply (docs/privacy.md). Chats have their own setting and sweep
    (`PARLEY_MAX_CHAT_AGE_DAYS`, api/retention.py): their age counts from their last use, not their writing."""

    events: float = (
        30  # a run's events in the log: prompts, moderation, answers, commands, dead letters
    )
    stream: float = (
        7  # the reply stream's token deltas in the log (the whole answer is in the events)
    )
    usage: float = 400  # usage rows and their rollups
    safety: float = 90  # safety decisions
    audit: float = 400  # the audit record, in the log and its table
    evals: float = 180  # eval results
    responses: float = 30  # stored Responses API responses

    def seconds(self, kind: str) -> int:
        """The period in whole seconds (0: kept until deleted)."""
        days: float = getattr(self, kind)
        return max(1, round(days * DAY_S)) if days else 0

    def kafka_ms(self, kind: str) -> int:
        """The period as a topic's retention.ms (-1: kept until deleted)."""
        return self.seconds(kind) * 1000 or -1


@dataclass(frozen=True)
class CassandraSettings:
    """Where Cassandra is and how many copies of a row must answer: what storage/ connects with."""

    hosts: tuple[str, ...]
    port: int
    keyspace: str
    datacenter: str
    replication: dict[str, int]
    consistency: str  # reads and writes
    serial_consistency: str  # lightweight transactions (IF ...)
    username: str = ""  # password authentication, when the cluster requires it
    password: str = field(default="", repr=False)
    ca_file: str = ""  # TLS to every node, checked against this CA
    periods: Periods = Periods()  # the TTLs of its tables that expire by age (storage/schema.py)


class StackSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PARLEY_", frozen=True, extra="ignore")

    kafka_bootstrap: str = "127.0.0.1:9092"
    kafka_username: str = Field(
        "",
        description="Set: every connection to Kafka is SASL_SSL, signing in with SCRAM-SHA-512 as this user "
        "(one per stage: api, moderation, scheduling, inference, persistence, metering, memory, registry).",
    )
    kafka_password: SecretStr = Field(
        SecretStr(""), description="Its password: set it from a secret."
    )
    kafka_ca_file: str = Field(
        "",
        description="A PEM file of the CA that signed the brokers' certificates (a mounted Secret).",
    )
    schema_registry_url: str = "http://127.0.0.1:8081"
    namespace: str = Field("", description="Prefix of every topic, consumer group and keyspace.")
    internal_token: SecretStr = Field(
        default_factory=local_internal_token,
        description="What the stack's own processes present to each other's internal pages (metering's usage "
        "reads and repairs): a Bearer token. Set it from a secret on a cluster; locally it is made once.",
    )
    # Replication and partitioning (docs/decisions/0011-replicated-data-plane.md). The defaults are a
    # production cluster's; the single-node local stack sets 1 copy in its environment (infra/stack.py).
    kafka_replication_factor: int = 3
    kafka_min_insync_replicas: int = 2
    chat_partitions: int = 12
    reply_partitions: int = 32
    cassandra_hosts: str = "127.0.0.1"
    cassandra_port: int = 9042
    keyspace: str = "parley"
    cassandra_datacenter: str = Field("datacenter1", description="This process's local datacenter.")
    cassandra_replication: dict[str, int] = Field(
        default_factory=lambda: {"datacenter1": 3},
        description="Copies of every row per datacenter.",
    )
    cassandra_consistency: str = "LOCAL_QUORUM"
    cassandra_serial_consistency: str = "LOCAL_SERIAL"  # the ledger's compare-and-set
    cassandra_username: str = Field(
        "", description="Set both when the cluster requires password authentication."
    )
    cassandra_password: SecretStr = Field(
        SecretStr(""), description="Its password: set it from a secret."
    )
    cassandra_ca_file: str = Field(
        "",
        description="A PEM file of the CA that signed the nodes' certificates: set, every connection is TLS "
        "and each node's certificate is checked against it (a mounted Secret).",
    )
    # Each person's text sealed with a key of their own (runtime/keys.py, docs/privacy.md).
    kek: SecretStr = Field(
        SecretStr(""),
        description="The key-encryption key: base64 of 32 random bytes (`openssl rand -base64 32`), the same in "
        "every process. Set it from a secret (or PARLEY_KEK_FILE); a process without it refuses to start.",
    )
    kek_file: str = Field(
        "", description="A file holding the KEK (a mounted Secret): read when kek is empty."
    )
    seal_text: bool = Field(
        True,
        description="false: people's text goes to the log as it is, to measure what sealing costs "
        "(bench/sealing.py); an erasure then cannot reach the log's copies.",
    )
    log_level: str = "INFO"
    log_format: Literal["text", "json"] = Field(
        "text", description="json: one object a line with trace and run ids."
    )
    host: str = Field(
        "127.0.0.1",
        description="The address this process's servers bind (its API, metrics and health pages): 0.0.0.0 in a "
        "container, so other services and the scraper reach it.",
    )
    # Usage rows (metering writes them; the migration makes a server's tables).
    usage_url: str = Field(
        "", description="chdb:///path (the embedded engine) or http://host:8123 (a server)."
    )
    usage_database: str = "parley"
    usage_user: str = Field(
        "", description="The ClickHouse server's user (else the URL's, else default)."
    )
    usage_password: SecretStr = Field(
        SecretStr(""), description="Its password: set it from a secret."
    )
    pools: dict[str, Pool] = Field(default_factory=lambda: dict(DEFAULT_POOLS))
    # How long each kind of data is kept, in days; 0: until deleted (Periods, docs/privacy.md). At most 20 years:
    # Cassandra's longest TTL.
    retain_events_days: float = Field(30, ge=0, le=7300, description="A run's events in the log.")
    retain_stream_days: float = Field(7, ge=0, le=7300, description="Token deltas.")
    retain_usage_days: float = Field(400, ge=0, le=7300, description="Usage rows, rollups.")
    retain_safety_days: float = Field(90, ge=0, le=7300, description="Safety decisions.")
    retain_audit_days: float = Field(400, ge=0, le=7300, description="The audit record.")
    retain_evals_days: float = Field(180, ge=0, le=7300, description="Eval results.")
    retain_responses_days: float = Field(30, ge=0, le=7300, description="Stored responses.")
    # Documents attached to a chat (docs/decisions/0027-documents-in-a-chat.md): the edge refuses a larger
    # file, the memory stage one with more pages (slides, sheets) and cuts the text into passages this long.
    document_max_mib: int = 20
    document_max_pages: int = 300
    document_passage_chars: int = 800
    documents_per_chat: int = 20
    default_pool: str = "small"
    # A guard model on an engine (safety/guard_model.py); empty: the embedded encoder's heads judge everything.
    guard_url: str = Field(
        "",
        description="An OpenAI-compatible server (SGLang, vLLM) serving Llama Guard 3 or 4: it judges harmful "
        "requests, harmful output and toxicity; prompt injection stays with the embedded encoder.",
    )
    guard_model: str = Field("llama-guard-3-8b", description="The guard's served model name.")
    guard_api_key: SecretStr = Field(SecretStr(""), description="Its API key, if it wants one.")

    @property
    def models(self) -> tuple[str, ...]:
        """Every model id served, the default pool's first."""
        ids = [self.pools[self.default_pool].model] + [p.model for p in self.pools.values()]
        return tuple(dict.fromkeys(ids))

    @property
    def usage_target(self) -> str:
        return self.usage_url or f"chdb://{state_dir() / 'clickhouse'}"

    @property
    def usage_db(self) -> str:
        return (
            f"{self.usage_database}_{self.namespace}".replace("-", "_").replace(".", "_")
            if self.namespace
            else self.usage_database
        )

    @property
    def periods(self) -> Periods:
        return Periods(
            **{kind: getattr(self, f"retain_{kind}_days") for kind in Periods.__dataclass_fields__}
        )

    @property
    def layout(self) -> Layout:
        periods = self.periods
        return Layout(
            self.chat_partitions,
            self.reply_partitions,
            self.kafka_replication_factor,
            self.kafka_min_insync_replicas,
            retention_ms=tuple((k, periods.kafka_ms(k)) for k in KEPT),
        )

    @property
    def cassandra(self) -> CassandraSettings:
        return CassandraSettings(
            hosts=tuple(h.strip() for h in self.cassandra_hosts.split(",") if h.strip()),
            port=self.cassandra_port,
            keyspace=self.keyspace_name,
            datacenter=self.cassandra_datacenter,
            replication=dict(self.cassandra_replication),
            consistency=self.cassandra_consistency,
            serial_consistency=self.cassandra_serial_consistency,
            username=self.cassandra_username,
            password=self.cassandra_password.get_secret_value(),
            ca_file=self.cassandra_ca_file,
            periods=self.periods,
        )

    @property
    def keyspace_name(self) -> str:
        return (
            f"{self.keyspace}_{self.namespace}".replace("-", "_")
            if self.namespace
            else self.keyspace
        )

    def kek_value(self) -> str:
        """The key-encryption key, from the setting or its file ("" when neither is set)."""
        if self.kek.get_secret_value():
            return self.kek.get_secret_value()
        return Path(self.kek_file).read_text().strip() if self.kek_file else ""

    def internal_headers(self) -> dict[str, str]:
        """How one of the stack's processes (or its CLI) calls another's internal pages."""
        return {"Authorization": f"Bearer {self.internal_token.get_secret_value()}"}

    def group(self, stage: str) -> str:
        return f"{self.namespace}.{stage}" if self.namespace else f"parley.{stage}"
