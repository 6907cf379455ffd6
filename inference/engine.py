"""One small interface in front of the engines. Both speak OpenAI-style streaming chat completions:
llama.cpp's llama-server (CPU, the embedded default) and SGLang's server (GPU, production), so one client
serves both; closing the stream aborts the sequence in either engine.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

import httpx


@dataclass(frozen=True)
class Request:
    run_id: str
    model: str
    messages: list[dict[str, str]]
    max_tokens: int
    temperature: float = 0.7


@dataclass
class Chunk:
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None


@dataclass
class Outcome:
    """What the engine reported for a whole run."""

    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    first_token_at: float | None = None
    text: list[str] = field(default_factory=list)


class Engine(Protocol):
    name: str

    def stream(self, request: Request) -> AsyncIterator[Chunk]: ...
    async def healthy(self) -> bool: ...
    async def aclose(self) -> None: ...


class OpenAIStreamEngine:
    """Streaming chat completions against llama-server or SGLang (`/v1/chat/completions`)."""

    def __init__(self, name: str, base_url: str, timeout_s: float = 300.0) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0))

    async def healthy(self) -> bool:
        try:
            response = await self._client.get(f"{self.base_url}/health", timeout=2.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def stream(self, request: Request) -> AsyncIterator[Chunk]:
        body = {
            "model": request.model,
            "messages": request.messages,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        for attempt in (1, 2):
            try:
                async with self._client.stream("POST", f"{self.base_url}/v1/chat/completions", json=body) as response:
                    if response.status_code != 200:
                        detail = (await response.aread()).decode(errors="replace")[:300]
                        raise EngineError(f"engine answered {response.status_code}: {detail}")
                    async for line in response.aiter_lines():
                        chunk = parse_sse_line(line)
                        if chunk is not None:
                            yield chunk
                return
            except httpx.RemoteProtocolError as exc:
                # llama-server (cpp-httplib) closes a keep-alive connection after 100 requests; a request sent
                # on it in that instant is refused before any byte of it is processed, so one retry is safe.
                if attempt == 2 or "without sending a response" not in str(exc):
                    raise

    async def aclose(self) -> None:
        await self._client.aclose()


class EngineError(RuntimeError):
    pass


def parse_sse_line(line: str) -> Chunk | None:
    """One `data:` line of an OpenAI-style stream -> a Chunk (None for keep-alives and [DONE])."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    payload = json.loads(data)
    if "error" in payload:
        raise EngineError(str(payload["error"])[:300])
    chunk = Chunk()
    for choice in payload.get("choices") or ():
        delta = choice.get("delta") or {}
        chunk.text += delta.get("content") or ""
        chunk.finish_reason = choice.get("finish_reason") or chunk.finish_reason
    usage = payload.get("usage")
    if usage:
        chunk.prompt_tokens = usage.get("prompt_tokens")
        chunk.completion_tokens = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details") or {}
        chunk.cached_tokens = details.get("cached_tokens")
    timings = payload.get("timings")  # llama-server's own accounting of reused prompt tokens
    if timings and chunk.cached_tokens is None and "cache_n" in timings:
        chunk.cached_tokens = timings["cache_n"]
    return chunk


async def generate(engine: Engine, request: Request) -> AsyncIterator[tuple[str, Outcome]]:
    """Run one request, yielding (text delta, running outcome); the outcome is complete after the last yield."""
    outcome = Outcome()
    async for chunk in engine.stream(request):
        if chunk.text:
            if outcome.first_token_at is None:
                outcome.first_token_at = time.perf_counter()
            outcome.text.append(chunk.text)
        if chunk.finish_reason:
            outcome.finish_reason = chunk.finish_reason
        if chunk.prompt_tokens is not None:
            outcome.prompt_tokens = chunk.prompt_tokens
            outcome.completion_tokens = chunk.completion_tokens or 0
        if chunk.cached_tokens is not None:
            outcome.cached_tokens = chunk.cached_tokens
        yield chunk.text, outcome
