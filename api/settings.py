"""Settings of one edge replica."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import NoDecode

from runtime.settings import StackSettings, local_jwt_secret


class ApiSettings(StackSettings):
    port: int = 8000
    edge_session_timeout_s: float = Field(
        30.0,
        description="A replica silent this long loses its reply partitions to the others. Long on purpose: "
        "only new runs need a replica's partitions (a resume reads the log on any replica), and a session "
        "shorter than the brokers' own 9 s failover plus the group's move to a new coordinator cost every "
        "stream a hand-off and new runs 10 s of 503s at most broker kills (bench/cluster.py, 10 s sessions).",
    )
    jwt_secret: SecretStr = Field(default_factory=local_jwt_secret)
    jwt_issuer: str = "parley-local"
    jwt_audience: str = "parley"
    max_content_chars: int = 32_000
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

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return (
            [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
        )
