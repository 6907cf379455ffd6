"""One small interface in front of the engines. Both speak OpenAI-style streaming chat completions:
llama.cpp's llama-server (CPU, the embedded default) and SGLang's server (GPU, production), so one client
serves both; closing the stream aborts the sequence in either engine. Both batch continuously (slots in
llama.cpp, the running batch in SGLang) and reuse cached prompt prefixes (slot prompt cache; RadixAttention).

A run taken over from a failed consumer continues from the text already published: the partial answer goes
in as the final assistant message with `continue_final_message` (both engines implement it, as vLLM does).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx


@dataclass(frozen=True)
class Request:
    run_id: str
    model: str
    messages: list[dict[str, str]]
    max_tokens: int
    temperature: float = 0.7
    # the answer so far, when a run is taken over: generation continues after it
    continuation: str = ""


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
    # streamed text chunks: the completion count when the engine reported none (a cancel)
    pieces: int = 0


class Engine(Protocol):
    name: str

    def stream(self, request: Request) -> AsyncIterator[Chunk]: ...
    async def healthy(self) -> bool: ...
    async def aclose(self) -> None: ...


class OpenAIStreamEngine:
    """Streaming chat completions against llama-server or SGLang (`/v1/chat/completions`)."""

    def __init__(
        self, name: str, base_url: str, api_key: str | None = None, timeout_s: float = 300.0
    ) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=5.0), headers=headers
        )

    async def healthy(self) -> bool:
        try:
            response = await self._client.get(f"{self.base_url}/health", timeout=2.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def body(self, request: Request) -> dict[str, Any]:
        messages = list(request.messages)
        body: dict[str, Any] = {}
        if request.continuation:
            messages.append({"role": "assistant", "content": request.continuation})
            body = {"continue_final_message": True, "add_generation_prompt": False}
        return {
            **body,
            "model": request.model,
            "messages": messages,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "stream": True,
            # Running token counts on every chunk, so a cancelled run is still metered to the token:
            # SGLang reads continuous_usage_stats, llama-server timings_per_token; each ignores the other.
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "timings_per_token": True,
            # llama-server reports a long prompt's prefill as it goes (a chunk with no text per engine step), so
            # the run can show progress before its first token (InferenceSettings.keepalive_s); SGLang ignores it.
            "return_progress": True,
        }

    async def stream(self, request: Request) -> AsyncIterator[Chunk]:
        body = self.body(request)
        for attempt in (1, 2):
            try:
                async with self._client.stream(
                    "POST", f"{self.base_url}/v1/chat/completions", json=body
                ) as response:
                    if response.status_code != 200:
                        detail = (await response.aread()).decode(errors="replace")[:300]
                        failure = EngineDown if response.status_code >= 500 else EngineError
                        raise failure(f"engine answered {response.status_code}: {detail}")
                    async for line in response.aiter_lines():
                        chunk = parse_sse_line(line)
                        if chunk is not None:
                            yield chunk
                return
            except httpx.RemoteProtocolError as exc:
                # llama-server (cpp-httplib) closes a keep-alive connection after 100 requests; a request sent
                # on it in that instant is refused before any byte of it is processed, so one retry is safe.
                if attempt == 2 or "without sending a response" not in str(exc):
                    raise EngineDown(f"engine connection broke: {exc}") from exc
            except httpx.TransportError as exc:
                raise EngineDown(f"engine unreachable: {type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        await self._client.aclose()


class EngineError(RuntimeError):
    """The engine refused this request (a 4xx, or an error in its stream): the run fails."""


class EngineDown(RuntimeError):
    """The engine is unreachable, failed (5xx) or aborted the sequence: the run is handed to a healthy engine."""


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
    if (
        chunk.finish_reason == "abort"
    ):  # SGLang aborted the sequence itself (e.g. out of memory, shutting down)
        raise EngineDown("the engine aborted the sequence")
    usage = payload.get("usage")
    if usage:
        chunk.prompt_tokens = usage.get("prompt_tokens")
        chunk.completion_tokens = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details") or {}
        chunk.cached_tokens = details.get("cached_tokens")
    timings = payload.get(
        "timings"
    )  # llama-server's own accounting: prompt_n new + cache_n reused tokens
    if timings and not usage and "prompt_n" in timings:
        chunk.cached_tokens = timings.get("cache_n", 0)
        chunk.prompt_tokens = timings["prompt_n"] + chunk.cached_tokens
        chunk.completion_tokens = timings.get("predicted_n", 0)
    elif timings and chunk.cached_tokens is None and "cache_n" in timings:
        chunk.cached_tokens = timings["cache_n"]
    return chunk


async def generate(
    engine: Engine, request: Request, cancel: asyncio.Event | None = None
) -> AsyncIterator[tuple[str, Outcome]]:
    """Run one request, yielding (text delta, running outcome); the outcome is complete after the last yield.

    When `cancel` is set the engine's stream is closed at once, even mid-prefill (closing it is how both
    engines abort a sequence: they free it at their next decode step), and the outcome ends "cancelled".
    """
    outcome = Outcome()
    async for chunk in _until(engine.stream(request), cancel, outcome):
        if chunk.text:
            outcome.pieces += 1
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
    if outcome.finish_reason == "cancelled":
        outcome.completion_tokens = max(outcome.completion_tokens, outcome.pieces)
        yield "", outcome


async def _until(
    chunks: AsyncIterator[Chunk], cancel: asyncio.Event | None, outcome: Outcome
) -> AsyncIterator[Chunk]:
    """The engine's chunks until they end or `cancel` is set; then the engine stream is closed."""
    stream = aiter(chunks)
    cancelled = asyncio.ensure_future(cancel.wait()) if cancel else None
    try:
        while True:
            step = asyncio.ensure_future(anext(stream))
            waited: set[asyncio.Future[Any]] = {step}
            if cancelled is not None:
                waited, _ = await asyncio.wait(
                    {step, cancelled}, return_when=asyncio.FIRST_COMPLETED
                )
            if step not in waited:
                step.cancel()
                await asyncio.wait({step})  # let the stream unwind (closes the HTTP response)
                outcome.finish_reason = "cancelled"
                return
            try:
                yield await step
            except StopAsyncIteration:
                return
    finally:
        if cancelled is not None:
            cancelled.cancel()
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
