"""PromptAccepted -> PromptModerated.

A minimal rule policy (builtin-0) so the stage is real on a real topic; trained classifiers and live policies
replace it under the safety issue. Every verdict is an event, so a new policy can be replayed over old traffic.
"""

from __future__ import annotations

import re
import time
import uuid

from processors.stage import Stage
from topics.codec import Event
from topics.pipeline import PROMPT_ACCEPTED, PROMPT_MODERATED

POLICY_VERSION = "builtin-0"
RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "prompt_injection",
        re.compile(
            r"\b(ignore|disregard|forget)\b.{0,30}\b(previous|prior|above|all)\b.{0,30}\b(instructions|rules|prompts?)\b",
            re.I | re.S,
        ),
    ),
    (
        "harmful_request",
        re.compile(
            r"\b(how (do i|to|can i)|steps to|instructions for)\b.{0,40}\b(make|build|synthesi[sz]e)\b.{0,30}"
            r"\b(bomb|explosive|nerve agent|bioweapon|meth(amphetamine)?)\b",
            re.I | re.S,
        ),
    ),
)


def moderate(prompt: Event) -> Event:
    """The verdict on one prompt (pure)."""
    # The OpenAI route sends the whole conversation, and the client wrote every turn of it: check them all.
    texts = [m["content"] for m in prompt.get("messages") or ()] or [prompt["content"]]
    category = next((name for name, rule in RULES for text in texts if rule.search(text)), None)
    return {
        "event_id": str(uuid.uuid4()),
        "prompt": prompt,
        "decision": "blocked" if category else "allowed",
        "category": category,
        "reason": f"matched the {category} rule" if category else None,
        "policy_version": POLICY_VERSION,
        "moderated_at": int(time.time() * 1000),
    }


def register(stage: Stage) -> None:
    async def handle(prompt: Event) -> None:
        await stage.publish(PROMPT_MODERATED, moderate(prompt), key=prompt["chat_id"])

    stage.consume(PROMPT_ACCEPTED, handle)
