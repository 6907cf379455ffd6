"""Settings of one edge replica."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import NoDecode

from api.oidc import RoleMap
from runtime.settings import StackSettings, local_jwt_secret

MAX_DAYS = 36_500  # a hundred years: the longest a chat's age may be set to (the store's day count is 32-bit)


class ApiSettings(StackSettings):
    port: int = 8000
    tls_cert_file: str = Field(
        "",
        description="The edge serves HTTPS with this certificate chain (PEM; a mounted Kubernetes Secret's "
        "tls.crt) and tls_key_file. Empty: plain HTTP, for a cluster whose ingress terminates TLS.",
    )
    tls_key_file: str = Field("", description="The certificate's private key (PEM; tls.key).")
    edge_session_timeout_s: float = Field(
        30.0,
        description="A replica silent this long loses its reply partitions to the others. Long on purpose: "
        "only new runs need a replica's partitions (a resume reads the log on any replica), and a session "
        "shorter than the brokers' own 9 s failover plus the group's move to a new coordinator cost every "
        "stream a hand-off and new runs 10 s of 503s at most broker kills (bench/cluster.py, 10 s sessions).",
    )
    jwt_secret: SecretStr = Field(default_factory=local_jwt_secret)
    dev_tokens: bool = Field(
        False,
        description="Accept the HS256 tokens `parley token` signs with jwt_secret (a local development "
        "convenience: the local stack turns it on). Off: only API keys and browser sessions sign in.",
    )
    jwt_issuer: str = "parley-local"
    jwt_audience: str = "parley"
    max_content_chars: int = 32_000
    redact_phone_region: str = Field(
        "US",
        description="The country a phone number written without its +code is read in, when a safety policy "
        "redacts phone numbers (ISO 3166 code).",
    )
    public_shares: bool = Field(
        False,
        description="Allow a shared chat to be readable without signing in (its owner chooses, per share); off: "
        "a share is for the deployment's signed-in people only.",
    )
    max_instruction_tokens: int = Field(
        300,
        description="The most tokens a person's own instructions, or a chat's, may take (each is counted within "
        "every prompt's budget).",
    )
    memories: bool = Field(
        True,
        description='Let people keep memories across their chats ("remember that …", or in settings) and recall '
        "them into their prompts; off: none is made or recalled (those kept can still be listed, exported and "
        "deleted).",
    )
    max_memories: int = Field(200, ge=0, description="The most memories one person may keep.")
    max_memory_chars: int = Field(500, ge=1, description="The longest one memory may be.")
    max_chat_age_days: int | None = Field(
        None,
        ge=1,
        le=MAX_DAYS,
        description="The longest a chat untouched is kept, for everyone (a person may choose fewer days); "
        "unset: kept until deleted.",
    )
    retention_check_s: int = Field(
        3600,
        ge=1,
        description="How often the edge deletes the chats past their age (one replica at a time).",
    )
    max_body_bytes: int = Field(
        4 * 1024 * 1024,
        description="A request body larger than this is refused (413) while it is read, before parsing or auth: "
        "room for an OpenAI-style request carrying a long conversation.",
    )
    header_timeout_s: float = Field(
        10.0,
        description="A request's headers must arrive within this of the connection opening (408 after).",
    )
    body_idle_timeout_s: float = Field(
        30.0, description="A request body that stops arriving this long: 408."
    )
    max_connections_per_client: int = Field(
        64, description="Connections one client address may hold at once; one more is refused 429."
    )
    max_streams_per_person: int = Field(
        32,
        ge=1,
        description="Resume streams one person may hold open at once on one replica (new runs are bounded by the "
        "admission limits); one more is refused 429 too_many_streams.",
    )
    trusted_proxies: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Addresses or CIDR networks of the proxies in front of the edge (an ingress, a company proxy), "
        "comma-separated: their connections are not limited per address; each client behind them is, by the "
        "address in X-Forwarded-For. Empty: forwarded headers are ignored.",
    )
    answer_store_wait_s: float = Field(
        5.0,
        description="How long a request about an answer whose run just ended waits for it to be stored.",
    )
    oidc_issuer: str = Field(
        "", description="The OpenID Connect provider's issuer URL (empty: no provider sign-in)."
    )
    oidc_client_id: str = "parley"
    oidc_client_secret: SecretStr = SecretStr("")
    oidc_scopes: str = "openid profile email"
    oidc_role_map: str = Field(
        "",
        description='JSON: {"claim": "groups", "roles": {group: owner|admin|auditor|member}, "tiers": '
        '{group: free|pro|enterprise}, "default_role", "default_tier"} (api/oidc.py RoleMap has the defaults).',
    )
    local_accounts: bool | None = Field(
        None,
        description="Sign-in with local accounts (name and password, argon2id): on, off, or unset: on exactly "
        "when no identity provider is configured.",
    )
    public_url: str = Field(
        "",
        description="The edge's address as browsers reach it (the sign-in's redirect address is built on it); "
        "empty: the address each request came to.",
    )
    session_check_s: int = Field(
        120,
        ge=1,
        description="A browser session is checked again at the identity provider this often: a person disabled "
        "there loses access within this bound.",
    )
    session_max_s: int = Field(12 * 3600, ge=60, description="A browser session's longest life.")
    cookie_secure: bool = Field(
        True,
        description="Session cookies only over HTTPS (browsers treat http://localhost as secure).",
    )
    default_max_tokens: int = 256
    max_tokens_limit: int = 4096
    metering_url: str = "http://127.0.0.1:6069"
    # the most a request waits for the scheduler's admit/reject decision
    admission_timeout_s: float = 10.0
    # a run that never starts ends with an error event, never hangs
    first_event_timeout_s: float = 120.0
    stream_idle_timeout_s: float = 60.0

    web_dir: Path = Field(
        Path(__file__).resolve().parent.parent / "web" / "dist",
        description="The built chat app (make web).",
    )

    @property
    def local_accounts_enabled(self) -> bool:
        return self.local_accounts if self.local_accounts is not None else not self.oidc_issuer

    @cached_property
    def role_map(self) -> RoleMap:
        return RoleMap.parse(self.oidc_role_map)

    @field_validator("oidc_role_map")
    @classmethod
    def _role_map(cls, value: str) -> str:
        RoleMap.parse(value)  # refused at start, not at the first sign-in
        return value

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return (
            [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
        )
