"""The chat API as its clients use it: the eval runner's, the tests' and the benches' one client.

`ChatClient` (blocking) and `AsyncChatClient` (asyncio) create chats, send a message or regenerate an answer
and read its stream, resume a run after a cursor, and cancel it. A stream comes back as a `Run`: its status,
its events as replay/sse.py parses them, and the time to its first token as the client saw it. `then` acts
mid-answer (cancel, kill a part, delete the chat), called once, as soon as `when` holds for the stream read so
far (by default: its first token); returning True drops the connection there, as a closed tab would.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from replay.sse import SseEvent, aiter_sse, iter_sse, shown

Then = Callable[["Run"], Any]  # a truthy answer stops reading
When = Callable[["Run"], bool]


def first_token(run: Run) -> bool:
    return run.tokens >= 1


@dataclass
class Run:
    """One stream of a run as the client read it."""

    status: int
    headers: httpx.Headers
    events: list[SseEvent] = field(default_factory=list)
    error: Any = None  # the JSON body of a response that is not a stream (429, 400, ...)
    ttft_s: float | None = None  # from the request to the first token event
    token_times: list[float] = field(default_factory=list)  # time.monotonic() as each token event arrived
    dropped: bool = False  # the connection broke (or `then` dropped it) before the stream's end

    @property
    def run_id(self) -> str | None:
        data = (e.get("data") for e in self.events)
        return next((d["run_id"] for d in data if isinstance(d, dict) and "run_id" in d), None)

    @property
    def text(self) -> str:
        """The answer as the chat app shows it: retracted text cut."""
        return shown(self.events)

    @property
    def tokens(self) -> int:
        return sum(e.get("event") == "token" for e in self.events)

    @property
    def names(self) -> list[str]:
        return [e.get("event", "") for e in self.events]

    @property
    def completed(self) -> dict[str, Any] | None:
        """run.completed's data (finish_reason, usage), or None for a stream that did not complete."""
        return next((e["data"] for e in self.events if e.get("event") == "run.completed"), None)

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
        if event.get("event") == "token":
            run.token_times.append(time.monotonic())
            if run.ttft_s is None:
                run.ttft_s = time.perf_counter() - self.started
        if self.then is not None and self.when(run):
            then, self.then = self.then, None
            if then(run):
                run.dropped = True
                return True
        return False


BROKEN = (httpx.RemoteProtocolError, httpx.ReadError)


def messages_path(chat_id: str) -> str:
    return f"/v1/chats/{chat_id}/messages"


def run_path(chat_id: str, run_id: str, action: str) -> str:
    return f"/v1/chats/{chat_id}/runs/{run_id}/{action}"


def resume_headers(last_event_id: str | None) -> dict[str, str]:
    return {"Last-Event-ID": last_event_id} if last_event_id else {}


class ChatClient:
    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def new_chat(self, **body: Any) -> str:
        response = self.http.post("/v1/chats", json=body or None)
        response.raise_for_status()
        return str(response.json()["id"])

    def send(
        self, chat_id: str, content: str, *, when: When = first_token, then: Then | None = None, **body: Any
    ) -> Run:
        """Post a message (with max_tokens, model, ... as the API takes them) and read its stream."""
        request = {"content": content, **body}
        return self._stream("POST", messages_path(chat_id), when, then, json=request)

    def regenerate(self, chat_id: str, run_id: str, **body: Any) -> Run:
        return self._stream("POST", run_path(chat_id, run_id, "regenerate"), first_token, None, json=body)

    def resume(self, chat_id: str, run_id: str, last_event_id: str | None = None) -> Run:
        """The run's events after the cursor (all of them without one), from any edge replica."""
        return self._stream(
            "GET", run_path(chat_id, run_id, "events"), first_token, None, headers=resume_headers(last_event_id)
        )

    def cancel(self, chat_id: str, run_id: str) -> httpx.Response:
        return self.http.post(run_path(chat_id, run_id, "cancel"))

    def _stream(self, method: str, path: str, when: When, then: Then | None, **kwargs: Any) -> Run:
        started = time.perf_counter()
        with self.http.stream(method, path, **kwargs) as response:
            run = Run(response.status_code, response.headers)
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


class AsyncChatClient:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def new_chat(self, **body: Any) -> str:
        response = await self.http.post("/v1/chats", json=body or None)
        response.raise_for_status()
        return str(response.json()["id"])

    async def send(
        self, chat_id: str, content: str, *, when: When = first_token, then: Then | None = None, **body: Any
    ) -> Run:
        request = {"content": content, **body}
        return await self._stream("POST", messages_path(chat_id), when, then, json=request)

    async def cancel(self, chat_id: str, run_id: str) -> httpx.Response:
        return await self.http.post(run_path(chat_id, run_id, "cancel"))

    async def _stream(self, method: str, path: str, when: When, then: Then | None, **kwargs: Any) -> Run:
        started = time.perf_counter()
        async with self.http.stream(method, path, **kwargs) as response:
            run = Run(response.status_code, response.headers)
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


def _json_or_text(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text
