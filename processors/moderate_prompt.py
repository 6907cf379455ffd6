"""PromptAccepted -> PromptModerated: input moderation before any inference.

The classifiers (safety/: one MiniLM encoder, a head per category, rules beside them) score every turn the
client wrote: the new message, or on the OpenAI route the whole conversation it sent. The tier's policy
(followed live from the policy topic) turns scores into a decision. A blocked prompt is refused by the
scheduler and never reaches an engine. Every verdict is an event with its scores and policy version, so a
new policy can be replayed over old traffic (python -m safety.replay).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from processors.settings import ProcessorSettings
from processors.stage import Handler, Publish, Stage, on
from safety.guard_model import moderator_for
from safety.moderator import Moderator, Verdict
from safety.policy import PolicyView
from topics.clock import now_ms
from topics.events import PromptAccepted, PromptModerated
from topics.pipeline import PROMPT_ACCEPTED, PROMPT_MODERATED

log = logging.getLogger(__name__)


def texts_of(prompt: PromptAccepted) -> list[str]:
    """What the user wrote: the OpenAI route sends the whole conversation, and the client wrote every turn
    of it, so its user and assistant turns are checked. Its system turn is the API caller's own instruction
    to the model (setting a role is what a system prompt is for), not an injection into it."""
    turns = [
        m["content"]
        for m in prompt.get("messages") or ()
        if m["role"] not in ("system", "developer")
    ]
    return turns or [prompt["content"]]


def moderated(prompt: PromptAccepted, verdict: Verdict) -> PromptModerated:
    """The PromptModerated event for a verdict (pure)."""
    decision = verdict.decision
    blocked = decision.blocked
    reason = None
    if decision.action:
        reason = f"{decision.category} scored {decision.score:.2f} (policy {verdict.policy_version}: {decision.action})"
    if verdict.error:
        reason = f"classifier error: {verdict.error}"
    return {
        "event_id": str(uuid.uuid4()),
        "prompt": prompt,
        "decision": "blocked" if blocked else "allowed",
        "category": decision.category,
        "reason": reason,
        "policy_version": verdict.policy_version,
        "scores": {k: round(v, 4) for k, v in verdict.scores.items()},
        "action": decision.action,
        "error": verdict.error,
        "check_ms": round(verdict.check_ms, 2),
        "moderated_at": now_ms(),
    }


@dataclass(frozen=True)
class Deps:
    publish: Publish
    moderator: Moderator
    policies: PolicyView


async def on_prompt(prompt: PromptAccepted, deps: Deps) -> None:
    policy = deps.policies.for_tier(prompt["tier"])
    verdict = await deps.moderator.check_async(policy, "input", texts_of(prompt))
    if verdict.decision.action:
        log.info(
            "run %s of %s: %s %s (score %.2f, policy %s)",
            prompt["run_id"],
            prompt["user_id"],
            verdict.decision.action,
            verdict.decision.category,
            verdict.decision.score or 0.0,
            verdict.policy_version,
        )
    await deps.publish(PROMPT_MODERATED, moderated(prompt, verdict), key=prompt["chat_id"])


HANDLERS: list[Handler[Deps]] = [on(PROMPT_ACCEPTED, on_prompt)]


def build(stage: Stage, settings: ProcessorSettings) -> None:
    policies = PolicyView(settings.kafka_bootstrap, settings.namespace, stage.name)
    policies.start()
    stage.serve(HANDLERS, Deps(stage.publish, moderator_for(settings), policies))
