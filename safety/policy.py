"""Safety policies are data: per tier, rules of (stage, category, threshold, action), changed at run time.

A policy lives on the compacted topic admin.safety-policies.v1, keyed by tier ('*' for every tier without
its own); every moderation stage, inference consumer, scheduler and edge follows it, so a change applies to
the next message without a restart. A decision records the policy version and the scores, so a new policy
can be replayed against past traffic (python -m safety.replay).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal, cast

from pydantic import BaseModel, Field

from runtime.tables import TopicTable
from topics.clock import now_ms
from topics.events import SafetyPolicy, SafetyRule
from topics.pipeline import SAFETY_POLICIES

Stage = Literal["input", "output", "context"]
Redactable = Literal["card", "secret", "email", "phone"]  # safety/redact.py KINDS
Action = Literal["block", "warn", "log"]
STRICTNESS = {"log": 0, "warn": 1, "block": 2}
ANY_TIER = "*"


class Rule(BaseModel):
    model_config = {"frozen": True, "extra": "forbid"}

    stage: Stage
    category: Literal["prompt_injection", "harmful_request", "toxic", "harmful_output"]
    threshold: float = Field(ge=0, le=1)
    action: Action


class Policy(BaseModel):
    model_config = {"frozen": True}

    version: str
    rules: tuple[Rule, ...]
    on_error: Literal["open", "closed"] = "open"
    # taken out of a person's messages at the edge, before the model and the log (safety/redact.py)
    redact: tuple[Redactable, ...] = ()

    def categories(self, stage: Stage) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.category for r in self.rules if r.stage == stage))


# Thresholds from the held-out evaluation (bench/results/safety_eval.json): a high bar where a false block
# costs the user an answer, a warning (recorded, shown to admins) below it. Short turns ("Hello again.") are
# where the heads are least sure, which is why injection blocks only from 0.95 (rules block at 1.0). The
# output bars are also checked on fresh streamed answers of the model we serve
# (bench/results/safety_false_retractions.json): 1 of 75 ordinary answers reaches 0.8 on harmful_output and
# 1 of 75 reaches 0.9 on toxic; windows of explicit bomb-making steps score 0.63, 0.78, then 0.89, and a
# block also retracts the warned windows before it (safety/output.py).
BUILTIN = Policy(
    version="builtin-2",
    rules=(
        Rule(stage="input", category="prompt_injection", threshold=0.95, action="block"),
        Rule(stage="input", category="prompt_injection", threshold=0.6, action="warn"),
        Rule(stage="input", category="harmful_request", threshold=0.97, action="block"),
        Rule(stage="input", category="harmful_request", threshold=0.7, action="warn"),
        Rule(stage="input", category="toxic", threshold=0.98, action="block"),
        Rule(stage="input", category="toxic", threshold=0.8, action="warn"),
        Rule(stage="output", category="harmful_output", threshold=0.8, action="block"),
        Rule(stage="output", category="harmful_output", threshold=0.6, action="warn"),
        Rule(stage="output", category="toxic", threshold=0.9, action="block"),
        Rule(stage="context", category="prompt_injection", threshold=0.9, action="block"),
    ),
)


@dataclass(frozen=True)
class Decision:
    action: (
        str | None
    )  # the strictest action whose rule matched: block | warn | log; None: nothing matched
    category: str | None
    score: float | None

    @property
    def blocked(self) -> bool:
        return self.action == "block"


def decide(policy: Policy, stage: Stage, scores: dict[str, float]) -> Decision:
    """The strictest matching rule; among equals, the category scored furthest over its threshold (pure)."""
    best: tuple[int, float, Rule] | None = None
    for rule in policy.rules:
        score = scores.get(rule.category)
        if rule.stage != stage or score is None or score < rule.threshold:
            continue
        key = (STRICTNESS[rule.action], score - rule.threshold, rule)
        if best is None or key[:2] > best[:2]:
            best = key
    if best is None:
        return Decision(None, None, None)
    rule = best[2]
    return Decision(rule.action, rule.category, scores[rule.category])


def from_record(record: SafetyPolicy) -> Policy:
    rules = tuple(
        Rule(**{k: r[k] for k in ("stage", "category", "threshold", "action")})
        for r in record["rules"]
    )
    redact = cast(tuple[Redactable, ...], tuple(record.get("redact") or ()))
    return Policy(
        version=record["version"], rules=rules, on_error=record["on_error"], redact=redact
    )


def to_record(tier: str, policy: Policy, changed_by: str) -> SafetyPolicy:
    return {
        "event_id": str(uuid.uuid4()),
        "tier": tier,
        "version": policy.version,
        "rules": [cast(SafetyRule, r.model_dump()) for r in policy.rules],
        "on_error": policy.on_error,
        "redact": list(policy.redact),
        "changed_by": changed_by,
        "changed_at": now_ms(),
    }


class PolicyView(TopicTable):
    """The policies as this replica last read them."""

    def __init__(self, bootstrap: str, namespace: str, reader: str) -> None:
        super().__init__(bootstrap, SAFETY_POLICIES, namespace, reader)

    def for_tier(self, tier: str) -> Policy:
        row = self.get(tier) or self.get(ANY_TIER)
        return from_record(cast(SafetyPolicy, row)) if row else BUILTIN
