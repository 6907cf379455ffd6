"""The chat API as its clients use it: the eval runner's, the tests' and the benches' one client.

`ChatClient` (blocking) and `AsyncChatClient` (asyncio) create chats, send a message or regenerate an answer
and read its stream, resume a run after a cursor, cancel it, and stream an OpenAI-style completion (from the
edge, or from an engine as a bench's baseline). A stream comes back as a `Run`: its status, its events as
replay/sse.py parses them, and its timing as the client saw it. `then` acts mid-answer (cancel, kill a part,
delete the chat), called once, as soon as `when` holds for the stream read so far (by default: its first
token); returning True drops the connection there, as a closed tab would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from replay.sse import SseEvent, aiter_sse, iter_sse, shown

Then = Callable[["Run"], Any]  # a truthy answer stops reading
When = Callable[["Run"], bool]
BROKEN = (httpx.RemoteProtocolError, httpx.ReadError)  # a stream cut off: the Run says `dropped`


def is_token(event: SseEvent) -> bool:
    """A piece of the answer: a chat stream's `token` event, or an OpenAI chunk carrying content."""
    if event.get("event") == "token":
        return True
    data = event.get("data")
    if not isinstance(data, dict) or not data.get("choices"):
        return False
    return bool((data["choices"][0].get("delta") or {}).get("content"))


@dataclass
class Run:
    """One stream of a run as the client read it."""

    status: int
    headers: httpx.Headers
    started: float = 0.0  # time.perf_counter() when the request left
    headers_s: float = 0.0  # from the request to its status line (a refusal's whole time)
    events: list[SseEvent] = field(default_factory=list)
    error: Any = None  # the JSON body of a response that is not a stream (429, 400, ...)
    first_s: float | None = None  # from the request to the first event
    ttft_s: float | None = None  # from the request to the first piece of the answer
    token_times: list[float] = field(default_factory=list)  # time.monotonic() as each piece arrived
    dropped: bool = False  # the connection broke (or `then` dropped it) before the stream's end

    @property
    def run_id(self) -> str | None:
        data = (e.get("data") for e in self.events)
        return next((d["run_id"] for d in data if isinstance(d, dict) and "run_id" in d), None)

    @property
    def text(self) -> str:
        """The answer as the chat app shows it (retracted text cut), or an OpenAI stream's content."""
        if any(e.get("event") for e in self.events):
            return shown(self.events)
        return "".join(
            e["data"]["choices"][0]["delta"]["content"] for e in self.events if is_token(e)
        )

    @property
    def tokens(self) -> int:
        return len(self.token_times)

    @property
    def names(self) -> list[str]:
        return [e.get("event", "") for e in self.events]

    @property
    def completed(self) -> dict[str, Any] | None:
        """run.completed's data (finish_reason, usage), or None for a stream that did not complete."""
        return next((e["data"] for e in self.events if e.get("event") == "run.completed"), None)

    @property
    def usage(self) -> dict[str, Any] | None:
        """The run's usage: run.completed's, or an OpenAI stream's usage chunk (stream_options.include_usage)."""
        if (done := self.completed) is not None:
            return dict(done.get("usage") or {})
        data = [
            e["data"]
            for e in self.events
            if isinstance(e.get("data"), dict) and e["data"].get("usage")
        ]
        return dict(data[-1]["usage"]) if data else None

    @property
    def code(self) -> str | None:
        """Why it was not served: the refusal's error code, or a stream's closing `error` event's."""
        if isinstance(self.error, dict):
            return str((self.error.get("error") or {}).get("code") or "") or None
        errors = [
            e["data"]
            for e in self.events
            if e.get("event") == "error" and isinstance(e.get("data"), dict)
        ]
        return errors[-1].get("code") if errors else None

    @property
    def last_id(self) -> str | None:
        return self.events[-1].get("id") if self.events else None


class _Reading:
    """Folds a stream's events into a Run and fires `then` once, when `when` first holds."""

    def __init__(self, run: Run, started: float, when: When, then: Then | None) -> None:
        self.run, self.started, self.when, self.then = run, started, when, then

    def add(self, event: SseEvent) -> bool:
        """Keep the event; True to stop reading."""
        run = self.run
        run.events.append(event)
        if run.first_s is None:
            run.first_s = time.perf_counter() - self.started
        if is_token(event):
            run.token_times.append(time.monotonic())
            if run.ttft_s is None:
                run.ttft_s = time.perf_counter() - self.started
        if self.then is not None and self.when(run):
            then, self.then = self.then, None
            if then(run):
                run.dropped = True
                return True
        return False


def first_token(run: Run) -> bool:
    return run.tokens >= 1


def never(run: Run) -> bool:
    return False


class _Requests:
    """The requests both clients make: paths and bodies, one place."""

    def __init__(self, base: str, headers: dict[str, str] | None) -> None:
        self.base, self.headers = base, headers or {}

    def url(self, path: str) -> str:
        return f"{self.base}{path}"

    def chat(self, chat_id: str, *rest: str) -> str:
        return self.url("/".join((f"/v1/chats/{chat_id}", *rest)))

    def with_headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**self.headers, **(extra or {})}

    @staticmethod
    def completion(messages: Sequence[dict[str, str]], body: dict[str, Any]) -> dict[str, Any]:
        return {"messages": list(messages), "stream": True, **body}


def _json_or_text(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


class ChatClient(_Requests):
    def __init__(
        self, http: httpx.Client, base: str = "", headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(base, headers)
        self.http = http

    def new_chat(self, **body: Any) -> str:
        response = self.http.post(self.url("/v1/chats"), json=body or None, headers=self.headers)
        response.raise_for_status()
        return str(response.json()["id"])

    def send(
        self,
        chat_id: str,
        content: str,
        *,
        when: When = first_token,
        then: Then | None = None,
        **body: Any,
    ) -> Run:
        """Post a message (with max_tokens, model, ... as the API takes them) and read its stream."""
        return self._stream(
            "POST", self.chat(chat_id, "messages"), when, then, json={"content": content, **body}
        )

    def regenerate(self, chat_id: str, run_id: str, **body: Any) -> Run:
        return self._stream(
            "POST", self.chat(chat_id, "runs", run_id, "regenerate"), never, None, json=body
        )

    def resume(
        self,
        chat_id: str,
        run_id: str,
        last_event_id: str | None = None,
        *,
        when: When = never,
        then: Then | None = None,
    ) -> Run:
        """The run's events after the cursor (all of them without one), from any edge replica."""
        cursor = {"Last-Event-ID": last_event_id} if last_event_id else {}
        return self._stream(
            "GET", self.chat(chat_id, "runs", run_id, "events"), when, then, extra=cursor
        )

    def cancel(self, chat_id: str, run_id: str) -> httpx.Response:
        return self.http.post(self.chat(chat_id, "runs", run_id, "cancel"), headers=self.headers)

    def complete(
        self,
        messages: Sequence[dict[str, str]],
        *,
        when: When = never,
        then: Then | None = None,
        **body: Any,
    ) -> Run:
        """A streamed OpenAI-style chat completion (the edge's /v1/chat/completions, or an engine's)."""
        request = self.completion(messages, body)
        return self._stream("POST", self.url("/v1/chat/completions"), when, then, json=request)

    def _stream(
        self,
        method: str,
        url: str,
        when: When,
        then: Then | None,
        extra: dict[str, str] | None = None,
        **kw: Any,
    ) -> Run:
        started = time.perf_counter()
        with self.http.stream(method, url, headers=self.with_headers(extra), **kw) as response:
            run = Run(
                response.status_code, response.headers, started, time.perf_counter() - started
            )
            if response.status_code != 200:
                response.read()
                run.error = _json_or_text(response)
                return run
            reading = _Reading(run, started, when, then)
            try:
                for event in iter_sse(response.iter_lines()):
                    if reading.add(event):
                        break
            except BROKEN:
                run.dropped = True
        return run


class AsyncChatClient(_Requests):
    def __init__(
        self, http: httpx.AsyncClient, base: str = "", headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(base, headers)
        self.http = http

    async def new_chat(self, **body: Any) -> str:
        response = await self.http.post(
            self.url("/v1/chats"), json=body or None, headers=self.headers
        )
        response.raise_for_status()
        return str(response.json()["id"])

    async def send(
        self,
        chat_id: str,
        content: str,
        *,
        when: When = first_token,
        then: Then | None = None,
        **body: Any,
    ) -> Run:
        request = {"content": content, **body}
        return await self._stream("POST", self.chat(chat_id, "messages"), when, then, json=request)

    async def cancel(self, chat_id: str, run_id: str) -> httpx.Response:
        return await self.http.post(
            self.chat(chat_id, "runs", run_id, "cancel"), headers=self.headers
        )

    async def complete(
        self,
        messages: Sequence[dict[str, str]],
        *,
        when: When = never,
        then: Then | None = None,
        **body: Any,
    ) -> Run:
        request = self.completion(messages, body)
        return await self._stream(
            "POST", self.url("/v1/chat/completions"), when, then, json=request
        )

    async def _stream(self, method: str, url: str, when: When, then: Then | None, **kw: Any) -> Run:
        started = time.perf_counter()
        async with self.http.stream(method, url, headers=self.headers, **kw) as response:
            run = Run(
                response.status_code, response.headers, started, time.perf_counter() - started
            )
            if response.status_code != 200:
                await response.aread()
                run.error = _json_or_text(response)
                return run
            reading = _Reading(run, started, when, then)
            try:
                async for event in aiter_sse(response.aiter_lines()):
                    if reading.add(event):
                        break
            except BROKEN:
                run.dropped = True
        return run
