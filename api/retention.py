"""Chats deleted by age: a person may choose to have their chats deleted once untouched for some days (`PATCH
/v1/me/settings {"delete_after_days"}`), and a deployment may set the longest any chat is kept
(`PARLEY_MAX_CHAT_AGE_DAYS`; a person may choose fewer days, not more). A person's pinned chats are kept past
their own choice, not past the deployment's. The sweep deletes a chat as its owner would (api/chat_state.py
erase_chat): its messages and memory by the stages, its settings and shares here, its row last.

Every edge replica runs the loop; a lease in Cassandra (storage/retention.py) lets the first in each interval
sweep, so N replicas sweep once. An admin can sweep now, or preview a sweep as of a later time
(`POST /v1/admin/retention/sweep`)."""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from api.chat_state import erase_chat
from api.deps import Services
from storage.ids import utc
from storage.rows import active_at

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Swept:
    user_id: str
    chat_id: uuid.UUID
    last_active_at: datetime


def days_kept(chosen: int | None, longest: int | None) -> int | None:
    """How many days a person's untouched chats are kept: their choice, at most the deployment's (pure)."""
    given = [d for d in (chosen, longest) if d]
    return min(given) if given else None


async def sweep(deps: Services, at: datetime, dry_run: bool = False) -> list[Swept]:
    """Delete (or with `dry_run`, only find) every chat untouched longer than its owner's days as of `at`."""
    longest = deps.settings.max_chat_age_days
    chosen = await deps.retention.chosen()
    people = await deps.retention.people() if longest else list(chosen)
    swept: list[Swept] = []
    for user_id in people:
        days = days_kept(chosen.get(user_id), longest)
        if days is None:
            continue
        cutoff = at - timedelta(days=days)
        marks = await deps.preferences.marks(user_id)
        for chat_id in await deps.retention.older(user_id, cutoff):
            chat = await deps.conversations.get_chat(chat_id)
            if chat is None or chat.user_id != user_id:
                continue
            active = utc(active_at(chat))
            own_choice_only = longest is None or active >= at - timedelta(days=longest)
            if active >= cutoff or (own_choice_only and chat_id in marks and marks[chat_id].pinned):
                continue  # a stale activity row of a chat used since; or pinned, kept past the person's days
            if not dry_run:
                await erase_chat(
                    deps.conversations,
                    deps.preferences,
                    deps.shares,
                    deps.documents,
                    deps.producer,
                    chat,
                )
            swept.append(Swept(user_id, chat_id, active))
    if swept and not dry_run:
        log.info(
            "retention: deleted %d chats of %d people", len(swept), len({s.user_id for s in swept})
        )
    return swept


async def sweep_forever(deps: Services) -> None:
    """Each interval, sweep if this replica holds the lease (the edge's background task)."""
    holder = f"{socket.gethostname()}:{deps.settings.port}"
    interval = deps.settings.retention_check_s
    while True:
        await asyncio.sleep(interval)
        try:
            if await deps.retention.take_lease(holder, interval):
                await sweep(deps, datetime.now(UTC))
        except Exception:
            log.exception("retention sweep failed; trying again in %d s", interval)
