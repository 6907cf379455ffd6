"""`Idempotency-Key` on the routes that make something: creating a chat, posting a message, a chat completion.

The first request with a key claims it in the store (storage/idempotency.py), naming the chat or run it makes,
and marks it made once the chat is written or the run's prompt is in the log. A retry with the same key, on any
replica, waits (bounded) for that and is answered with the same chat, or the same run's stream read from the
log: never a second. A request that fails before it made anything, or whose run was refused, releases the key,
so its retry runs anew. The same key with another request (another route or body) is a 422."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Header
from pydantic import BaseModel

from api.auth import Principal
from api.deps import Services
from api.errors import ApiError
from api.replies import REJECTED, Reply
from api.runs import rejection_error
from api.streams import StreamTimeout, from_log
from storage.idempotency import Claim, IdempotencyKeys

log = logging.getLogger(__name__)

# how long a retry waits for the first request to make what it claimed (a run: its prompt published)
SETTLE_S = 5.0

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="A retry with the same key (within 24 h) gets the first request's chat or run, never a "
        "second; 1 to 255 printable characters.",
    ),
]


def digest(route: str, body: BaseModel | None) -> str:
    """What a key's request was: its route and its body, as parsed."""
    raw = body.model_dump_json() if body is not None else ""
    return hashlib.sha256(f"{route}\n{raw}".encode()).hexdigest()


def checked(key: str) -> str:
    if not 1 <= len(key) <= 255 or not key.isprintable() or not key.isascii():
        raise ApiError(
            400,
            "Idempotency-Key must be 1 to 255 printable ASCII characters.",
            "invalid_idempotency_key",
            "Idempotency-Key",
        )
    return key


async def claim(store: IdempotencyKeys, user: Principal, key: str, wanted: Claim) -> Claim | None:
    """None when this request now holds the key (it makes what `wanted` names, then calls `made` or
    `release`); otherwise the first request's claim, once it has made it. 409 while the first is still at it
    after SETTLE_S; 422 when the key was used with another request."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        held = await store.claim(user.user_id, key, wanted)
        if held is None:
            return None
        if held.request != wanted.request:
            raise ApiError(
                422,
                "This Idempotency-Key was used with another request; use a new key for a new request.",
                "idempotency_key_reused",
                "Idempotency-Key",
            )
        if held.published:
            log.info("%s retried with idempotency key: the first request's answer", user.user_id)
            return held
        if time.monotonic() >= deadline:
            raise ApiError(
                409,
                "A request with this Idempotency-Key is still being processed; retry shortly.",
                "idempotency_key_in_use",
                headers={"Retry-After": "1"},
            )
        await asyncio.sleep(0.1)


class Holder:
    """The request holding a key (or sending none: then nothing to do): `made` once what it claimed exists,
    `failed` when it fails. The key is released when it failed before making anything or was refused (an
    ApiError: the retry runs anew); kept when it failed after (the client went away: the retry reads the run)."""

    def __init__(self, store: IdempotencyKeys, user: Principal, key: str | None) -> None:
        self.store, self.user, self.key = store, user, key
        self.is_made = False

    async def made(self) -> None:
        """Best effort: unmarked, the key's retries get 409 until it expires (never a second chat or run)."""
        self.is_made = True
        if self.key is None:
            return
        try:
            await self.store.published(self.user.user_id, self.key)
        except Exception:
            log.warning(
                "idempotency key of %s not marked made (retries get 409)", self.user.user_id
            )

    async def failed(self, exc: BaseException) -> None:
        if self.key is None or (self.is_made and not isinstance(exc, ApiError)):
            return
        try:
            await asyncio.shield(self.store.release(self.user.user_id, self.key))
        except Exception:
            log.warning("idempotency key of %s not released (retries get 409)", self.user.user_id)


async def first_replies(
    deps: Services, run_id: str, partition: int, stream_refusals: bool
) -> tuple[Reply, AsyncIterator[Reply]]:
    """The first request's run, read from the log from its start, refused as the first request was."""
    replies = aiter(from_log(deps, partition, run_id, None))
    try:
        first = await anext(replies)
    except (StopAsyncIteration, StreamTimeout):
        raise ApiError(504, "The first request's run has no record yet.", "timeout") from None
    if first.kind == REJECTED and not (
        stream_refusals and first.rejection["code"] == "content_filter"
    ):
        raise rejection_error(first.rejection)
    return first, replies
