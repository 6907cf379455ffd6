"""One small interface in front of the engines. Both speak OpenAI-style streaming chat completions:
llama.cpp's llama-server (CPU, the embedded default) and SGLang's server (GPU, production), so one client
serves both. Both batch continuously (slots in llama.cpp, the running batch in SGLang) and reuse cached prompt
prefixes (slot prompt cache; RadixAttention).

SGLang as its server code behaves (read at v0.5.23): each attempt at a run is one engine request named by its
`rid`, and a stop (a cancel, a hand-off) is `POST /abort_request` for that rid before the stream is closed (a
closed stream alone is aborted only after a delay, and some versions decoded on to max_tokens); the run's
`priority` orders SGLang's queue under `--enable-priority-scheduling` (higher first, Parley's order too); a 503
means the engine is full, so the attempt waits and is sent again; any other refusal fails that run only. Only
an engine that cannot be reached (or fails its health check, inference/worker.py) is taken out of its pool.

A run taken over from a failed consumer continues from the text already published: the partial answer goes
in as the final assistant message with `continue_final_message` (both engines implement it, as vLLM does).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from inference import calls

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Request:
    run_id: str
    model: str
    messages: list[dict[str, Any]]
    max_tokens: int
    temperature: float = 0.7
    # the client's sampling, response format and tools as body fields (inference/calls.py)
    options: dict[str, Any] = field(default_factory=dict)
    # the answer must be tool calls: the text is the constrained JSON of them, never streamed as text
    forced_calls: bool = False
    # the answer so far, when a run is taken over: generation continues after it
    continuation: str = ""
    priority: int | None = None  # the run's (higher first); SGLang orders its queue by it
    attempt: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @property
    def rid(self) -> str:
        """The engine's name for this attempt: an abort stops this one and no other."""
        return f"{self.run_id}-{self.attempt}"


@dataclass
class Chunk:
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI deltas


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
    tool_calls: list[dict[str, Any]] = field(
        default_factory=list
    )  # whole, once the stream has ended


class Engine(Protocol):
    name: str

    def stream(self, request: Request) -> AsyncIterator[Chunk]: ...
    async def abort(self, request: Request) -> None: ...
    async def healthy(self) -> bool: ...
    async def metrics(self) -> bytes | None: ...
    async def aclose(self) -> None: ...


class OpenAIStreamEngine:
    """Streaming chat completions against llama-server or SGLang (`/v1/chat/completions`)."""

    def __init__(
        self,
        name: str,
        base_url: str,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        *,
        slots: int = 64,
        health_timeout_s: float = 10.0,
        busy_wait_s: float = 30.0,
    ) -> None:
        self.name = name
        self.sglang = name == "sglang"
        self.base_url = base_url.rstrip("/")
        self.health_timeout_s = health_timeout_s
        self.unhealthy_reason = ""  # why the last health check failed
        self.busy_wait_s = busy_wait_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # A connection per slot, and room for the health checks and aborts beside them (httpx's default pool
        # of 100 would queue slots beyond it without a word).
        limits = httpx.Limits(max_connections=slots + 8, max_keepalive_connections=slots + 8)
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=5.0), headers=headers, limits=limits
        )

    async def healthy(self) -> bool:
        """SGLang's /health runs a one-token generation when the engine is idle: a busy engine answers within
        the timeout, which is seconds, not the one second a cheap probe gets."""
        for attempt in (1, 2):
            try:
                response = await self._client.get(
                    f"{self.base_url}/health", timeout=self.health_timeout_s
                )
            except httpx.RemoteProtocolError as exc:
                # A kept-alive connection the server closed as it was reused (a request refused before any
                # byte of it was read, as stream() meets it): asked again on a new one, never an eviction.
                self.unhealthy_reason = f"{type(exc).__name__}: {exc}"
                if attempt == 1:
                    continue
                return False
            except httpx.HTTPError as exc:
                self.unhealthy_reason = f"{type(exc).__name__}: {exc}"
                return False
            self.unhealthy_reason = (
                "" if response.status_code == 200 else f"HTTP {response.status_code}"
            )
            return response.status_code == 200
        return False

    async def metrics(self) -> bytes | None:
        """The engine's own Prometheus page (SGLang with --enable-metrics, llama-server with --metrics), for the
        consumer to serve beside its own: the engine listens on the pod's loopback only. None when it has none."""
        try:
            response = await self._client.get(f"{self.base_url}/metrics", timeout=5.0)
        except httpx.HTTPError as exc:
            log.warning("engine metrics unavailable: %s", exc)
            return None
        return response.content if response.status_code == 200 else None

    async def abort(self, request: Request) -> None:
        """Stop this attempt in the engine now (SGLang); llama-server stops a sequence when its stream closes."""
        if not self.sglang:
            return
        try:
            await self._client.post(
                f"{self.base_url}/abort_request", json={"rid": request.rid}, timeout=5.0
            )
        except httpx.HTTPError as exc:  # the closed stream still stops it, later
            log.warning("run %s: abort_request failed: %s", request.run_id, exc)

    def body(self, request: Request) -> dict[str, Any]:
        messages = list(request.messages)
        body: dict[str, Any] = {}
        if request.continuation:
            messages.append({"role": "assistant", "content": request.continuation})
            body = {"continue_final_message": True, "add_generation_prompt": False}
        if self.sglang:
            body["rid"] = request.rid
            if request.priority is not None:
                body["priority"] = request.priority
        return {
            **body,
            **request.options,
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
        broken, pause, started = 0, 0.25, False
        deadline = time.monotonic() + self.busy_wait_s
        while True:
            try:
                async with self._client.stream(
                    "POST", f"{self.base_url}/v1/chat/completions", json=body
                ) as response:
                    # A full engine refuses before running any of it; waited out while the wait allows, then
                    # the same request is sent again. Others refuse with an HTTP 503; SGLang with a 200 and a
                    # 503 error chunk in the stream (after a token, that chunk fails the run instead).
                    can_wait = time.monotonic() + pause < deadline
                    refused = response.status_code == 503 and can_wait
                    if refused:
                        await response.aread()
                    elif response.status_code != 200:  # this request's refusal: the engine stays
                        detail = (await response.aread()).decode(errors="replace")[:300]
                        raise EngineError(f"engine answered {response.status_code}: {detail}")
                    else:
                        async for line in response.aiter_lines():
                            try:
                                chunk = parse_sse_line(line)
                            except EngineBusy:
                                if started or not can_wait:
                                    raise
                                refused = True
                                break
                            if chunk is not None:
                                started = started or bool(chunk.text)
                                yield chunk
                if refused:
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, 4.0)
                    continue
                return
            except httpx.RemoteProtocolError as exc:
                # llama-server (cpp-httplib) closes a keep-alive connection after 100 requests; a request sent
                # on it in that instant is refused before any byte of it is processed, so one retry is safe.
                broken += 1
                if broken == 2 or "without sending a response" not in str(exc):
                    raise EngineDown(f"engine connection broke: {exc}") from exc
            except httpx.TransportError as exc:
                raise EngineDown(f"engine unreachable: {type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        await self._client.aclose()


class EngineError(RuntimeError):
    """The engine refused or failed this request (an HTTP error, a 503 for longer than the wait, or a system
    abort in its stream: a timeout, out of memory): the run fails; the engine stays in its pool."""


class EngineBusy(EngineError):
    """A 503 in the engine's stream: SGLang's queue full, a request that waited past its timeout, or one retracted
    under memory pressure (tests/unit/data/sglang/<version>/)."""


class EngineDown(RuntimeError):
    """The engine is unreachable, or ended the sequence itself without an error (shutting down): the run is
    handed to a healthy engine."""


def parse_sse_line(line: str) -> Chunk | None:
    """One `data:` line of an OpenAI-style stream -> a Chunk (None for keep-alives and [DONE])."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    payload = json.loads(data)
    if "error" in payload:  # SGLang's system abort: {"error": {"message", "type", "code"}}
        error = payload["error"]
        busy = isinstance(error, dict) and error.get("code") == 503
        raise (EngineBusy if busy else EngineError)(str(error)[:300])
    chunk = Chunk()
    for choice in payload.get("choices") or ():
        delta = choice.get("delta") or {}
        chunk.text += delta.get("content") or ""
        chunk.tool_calls.extend(delta.get("tool_calls") or ())
        chunk.finish_reason = choice.get("finish_reason") or chunk.finish_reason
    if (
        chunk.finish_reason == "abort"
    ):  # a graceful abort nobody here asked for: the engine is stopping
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
    engine: Engine,
    request: Request,
    cancel: asyncio.Event | None = None,
    heartbeat_s: float | None = None,
) -> AsyncIterator[tuple[str, Outcome]]:
    """Run one request, yielding (text delta, running outcome); the outcome is complete after the last yield.

    When `cancel` is set the engine is told to stop the request (SGLang's abort_request) and its stream is
    closed at once, even mid-prefill (llama-server frees a closed stream's slot at its next step); the outcome
    ends "cancelled". With `heartbeat_s`, an empty delta is yielded whenever the engine has been silent that
    long: SGLang sends nothing (not even its response headers) while a request waits in its queue or is
    prefilled, and the edge counts only silence against a run.
    """
    outcome, native = Outcome(), calls.Calls()
    async for chunk in _until(
        engine.stream(request), cancel, outcome, lambda: engine.abort(request), heartbeat_s
    ):
        if chunk.text:
            outcome.pieces += 1
            if outcome.first_token_at is None:
                outcome.first_token_at = time.perf_counter()
            outcome.text.append(chunk.text)
            if request.forced_calls:
                chunk.text = ""  # the calls' JSON: published whole as tool calls at the end
        native.add(chunk.tool_calls)
        if chunk.finish_reason:
            outcome.finish_reason = chunk.finish_reason
        if chunk.prompt_tokens is not None:
            outcome.prompt_tokens = chunk.prompt_tokens
            outcome.completion_tokens = chunk.completion_tokens or 0
        if chunk.cached_tokens is not None:
            outcome.cached_tokens = chunk.cached_tokens
        yield chunk.text, outcome
    outcome.tool_calls = native.whole()
    if request.forced_calls and (forced := calls.forced_calls("".join(outcome.text))):
        outcome.tool_calls, outcome.text = forced, []
    if outcome.tool_calls and outcome.finish_reason == "stop":
        outcome.finish_reason = "tool_calls"
    if outcome.finish_reason == "cancelled":
        outcome.completion_tokens = max(outcome.completion_tokens, outcome.pieces)
        yield "", outcome


async def _until(
    chunks: AsyncIterator[Chunk],
    cancel: asyncio.Event | None,
    outcome: Outcome,
    abort: Callable[[], Awaitable[None]],
    heartbeat_s: float | None = None,
) -> AsyncIterator[Chunk]:
    """The engine's chunks until they end or `cancel` is set; then the engine is told to stop the request and
    its stream is closed. An empty chunk stands for each `heartbeat_s` of the engine's silence."""
    stream = aiter(chunks)
    cancelled = asyncio.ensure_future(cancel.wait()) if cancel else None
    step: asyncio.Future[Chunk] | None = None
    try:
        while True:
            if step is None:
                step = asyncio.ensure_future(anext(stream))
            watched: set[asyncio.Future[Any]] = {step} if cancelled is None else {step, cancelled}
            waited, _ = await asyncio.wait(
                watched,
                timeout=heartbeat_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if not waited:  # silence: the request waits in the engine
                yield Chunk()
                continue
            if step not in waited:
                await abort()
                step.cancel()
                await asyncio.wait({step})  # let the stream unwind (closes the HTTP response)
                outcome.finish_reason = "cancelled"
                return
            done, step = step, None
            try:
                yield await done
            except StopAsyncIteration:
                return
    finally:
        if step is not None and not step.done():
            step.cancel()
        if cancelled is not None:
            cancelled.cancel()
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
