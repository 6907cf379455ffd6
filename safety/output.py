"""Output moderation on the stream: a run's answer is checked in windows of tokens while it is generated.

Tokens are published as they come (no added inter-token delay); every `window_tokens` new tokens the text
new since the last clean check (with some preceding context) is scored in a worker thread, one check at a
time. A window the policy blocks stops the run at the engine (`on_block`) and retracts the answer from the
start of that window, or of the windows right before it that the policy warned on: everything before had
passed a check clean. The last window is checked before the run completes, so a retraction always precedes
the end of the stream and the stored answer never holds it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from safety.moderator import Moderator, Verdict
from safety.policy import Policy
from topics.clock import now_ms
from topics.events import ModeratedWindow, OutputModerated

log = logging.getLogger(__name__)

CONTEXT_CHARS = 400  # text before a window's new part that is scored with it
WINDOWS_PER_CHECK = 4  # 256-token windows: a check reads up to ~1000 tokens
# The heads were trained on whole answers and misread a few words ("Once upon a time" scored as harmful):
# an answer is scored once it has this much text, so an answer shorter than this is never checked.
MIN_CHARS = 100


class OutputGuard:
    def __init__(
        self,
        moderator: Moderator,
        policy: Policy,
        on_block: Callable[[], None],
        window_tokens: int = 32,
        prior_text: str = "",
    ) -> None:
        self.moderator = moderator
        self.policy = policy
        self.on_block = on_block
        self.window_tokens = window_tokens
        self.text = prior_text  # a run taken over re-checks what its predecessor published
        self.checked = 0  # the answer up to here passed a check
        self.windows: list[ModeratedWindow] = []
        self.blocked: Verdict | None = None
        self.retract_from: int | None = None
        self.warned: Verdict | None = None
        self.error: str | None = None
        # where the windows the policy warned on in a row began
        self._suspect_from: int | None = None
        self._tokens_at_check = 0
        self._pending: asyncio.Task[None] | None = None

    def feed(self, piece: str, tokens: int) -> None:
        """A piece of the answer; tokens: completion tokens so far. Starts a check when a window is due."""
        self.text += piece
        idle = self._pending is None or self._pending.done()
        due = tokens - self._tokens_at_check >= self.window_tokens and len(self.text) >= MIN_CHARS
        if self.blocked is None and idle and due:
            self._tokens_at_check = tokens
            self._pending = asyncio.create_task(self._check(len(self.text), urgent=False))

    async def _check(self, end: int, urgent: bool) -> None:
        start = self.checked
        if end <= start:
            return
        window = self.text[max(0, start - CONTEXT_CHARS) : end]
        # A window checked while the answer streams on holds nothing up; the last one holds its end.
        verdict = await self.moderator.check_async(
            self.policy, "output", [window], WINDOWS_PER_CHECK, urgent=urgent
        )
        self.windows.append(
            {
                "start": start,
                "end": end,
                "scores": dict(verdict.scores),
                "check_ms": round(verdict.check_ms, 2),
            }
        )
        if verdict.error:
            self.error = verdict.error
        if verdict.blocked:
            # Harm builds up: the windows just before this one that the policy warned on are retracted too.
            self.blocked = verdict
            self.retract_from = start if self._suspect_from is None else self._suspect_from
            log.info(
                "output window [%d, %d) blocked: %s %.2f (policy %s); retracting from %d",
                start,
                end,
                verdict.decision.category,
                verdict.decision.score or 0.0,
                verdict.policy_version,
                self.retract_from,
            )
            self.on_block()
            return
        if verdict.decision.action and self.warned is None:
            self.warned = verdict
        if verdict.decision.action != "warn":
            self._suspect_from = None
        elif self._suspect_from is None:
            self._suspect_from = start
        self.checked = end

    async def idle(self) -> None:
        """Wait for the check in flight, if any."""
        if self._pending is not None:
            await self._pending

    async def finish(self) -> None:
        """Wait for the check in flight, then check what is left unchecked."""
        await self.idle()
        if self.blocked is None and self.checked < len(self.text) and len(self.text) >= MIN_CHARS:
            await self._check(len(self.text), urgent=True)

    def kept(self) -> str:
        """The answer that stays: all of it, or what precedes the retracted part."""
        return self.text if self.retract_from is None else self.text[: self.retract_from]

    def event(self, run: Mapping[str, Any]) -> OutputModerated:
        """The run's OutputModerated event."""
        prompt = run["prompt"]
        decided = self.blocked or self.warned
        return {
            "event_id": str(
                uuid.uuid5(uuid.NAMESPACE_URL, f"parley:output-moderated:{prompt['run_id']}")
            ),
            "run_id": prompt["run_id"],
            "chat_id": prompt["chat_id"],
            "user_id": prompt["user_id"],
            "tier": prompt["tier"],
            "policy_version": self.policy.version,
            "windows": self.windows,
            "action": decided.decision.action if decided else None,
            "category": decided.decision.category if decided else None,
            "retracted_from": self.retract_from,
            "error": self.error,
            "moderated_at": now_ms(),
        }
