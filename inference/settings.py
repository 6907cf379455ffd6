"""Settings of an inference consumer (one per engine; any number per pool)."""

from __future__ import annotations

from topics.settings import StackSettings


class InferenceSettings(StackSettings):
    pool: str = "small"
    engine: str = "llamacpp"  # llamacpp: start llama-server as a child; openai: an existing SGLang/llama server
    engine_url: str = ""  # for engine=openai, e.g. http://sglang:30000
    llama_port: int = 8081
    slots: int = 8  # sequences in flight; the consumer pulls runs only while a slot is free
    slot_context: int = 2048
    threads: int = 1  # 1 is fastest on a busy 2-core box: more threads spin-wait (see INFRA.md)
    temperature: float = 0.7
    coalesce_ms: float = 20.0
    metrics_port: int = 9101
    health_interval_s: float = 5.0
