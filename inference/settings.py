"""Settings of an inference consumer (one per engine; any number per pool)."""

from __future__ import annotations

import os
import socket

from pydantic import Field, SecretStr

from runtime.settings import StackSettings


class InferenceSettings(StackSettings):
    pool: str = "small"
    worker_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    # llamacpp: start llama-server as a child; sglang or openai: an existing server
    engine: str = "llamacpp"
    engine_url: str = ""  # for an existing server, e.g. http://sglang:30000
    # the existing server's key (SGLang --api-key); llamacpp makes its own
    engine_api_key: SecretStr | None = None
    llama_port: int = 8081
    slots: int = 8  # sequences in flight in the engine
    # runs read ahead and waiting for a slot here (so the best one can start first)
    prefetch: int = 32
    # a waiting run gains one priority level per this many seconds (no starvation)
    aging_s: float = 10.0
    status_interval_s: float = 0.25
    threads: int = 1  # 1 is fastest on a busy 2-core box: more threads spin-wait (see INFRA.md)
    # Tokens one engine step takes (llama.cpp -b/-ub): a long prompt (a summary run's, a new chat's) is
    # prefilled in chunks of this size, each step also advancing every sequence already generating, so it
    # never stalls the others for its whole prefill (chunked prefill, as SGLang does by default).
    batch: int = 256
    # A run whose prompt is still being prefilled, or waits in the engine's queue, publishes an empty delta
    # this often (llama-server reports each prefill step; SGLang is silent, so the consumer's own timer
    # speaks): the edge's no-progress timeout counts only silence, and a long prompt on a CPU takes minutes.
    keepalive_s: float = 10.0
    kv_cache_type: str = "q8_0"  # llama.cpp -ctk/-ctv: f16, q8_0 (half the memory of f16), q4_0
    # llama.cpp --cache-ram: host memory for slots' states that may be reused
    prompt_cache_mib: int = 64
    # A background run (a summary) starts only once the engine has had no reply for this long. It stops when a
    # reply arrives, but llama-server acts on a cancel only between engine steps (each up to `batch` prompt
    # tokens), so a summary caught mid-prefill would hold the engine for a step; starting one while a user is
    # still in the middle of a chat also mostly wasted its prefill (the first 200-turn bench: 91 of 99 summary
    # runs stopped, and replies sent meanwhile had a p50 TTFT 1.47x the rest).
    background_idle_s: float = 3.0
    # then a background run starts beside the replies, and is not stopped
    background_patience_s: float = 60.0
    temperature: float = 0.7
    coalesce_ms: float = 20.0
    metrics_port: int = 9101
    health_interval_s: float = 2.0
    # How long a health check may take: SGLang's /health runs a one-token generation when it is idle.
    engine_health_timeout_s: float = 10.0
    # An engine answering 503 (full) gets the attempt again, backing off, for this long; then the run fails.
    engine_busy_wait_s: float = 30.0
    # A consumer that dies stops heartbeating; after this its partitions, and runs, move to the pool's others.
    session_timeout_ms: int = 6000
    # check the answer in windows while it streams (safety/output.py)
    output_moderation: bool = True
    moderation_window_tokens: int = 32
    # output checks run at once (each on a thread of its own): one per CPU the consumer has. At GPU rates (64
    # streams) one is far behind (bench/results/output_check_load.json).
    moderation_workers: int = 1
    # a run still unserved this long after scheduling fails with an error
    run_deadline_s: float = 300.0
    # a run calling registered MCP servers' tools makes at most this many calls; then it must answer in words
    max_tool_calls: int = 8

    @property
    def slot_context(self) -> int:
        return self.pools[self.pool].context

    @property
    def model(self) -> str:
        return self.pools[self.pool].model
