"""A tier's redaction (its safety policy's `redact` kinds, safety/redact.py), applied by the edge to what a person
sends before anything is written or published: a chat message sent or edited, and the user messages of an
OpenAI-style request. The person is told what was taken out: the chat stream opens with `message.redacted`
(the text as kept), and an OpenAI-style response carries `X-Parley-Redacted`."""

from __future__ import annotations

import json
import logging
from typing import Any

from prometheus_client import Counter

from api.auth import Principal
from api.deps import Services
from api.settings import ApiSettings
from safety.policy import PolicyView
from safety.redact import KINDS, Redacted, redact

log = logging.getLogger(__name__)
HEADER = "X-Parley-Redacted"

REDACTED = Counter(
    "parley_edge_redactions_total",
    "Messages the edge took secrets or personal data out of, by kind",
    ["kind"],
)


def counted(user: Principal, out: Redacted, where: str) -> Redacted:
    for kind in out.kinds:
        REDACTED.labels(kind).inc()
    if out.changed:
        log.info("%s of %s: %s taken out", where, user.user_id, ", ".join(out.kinds))
    return out


def redacted(
    policies: PolicyView, settings: ApiSettings, user: Principal, text: str, where: str = "message"
) -> Redacted:
    """The text as the person's tier's policy keeps it."""
    kinds = policies.for_tier(user.tier).redact
    return counted(user, redact(text, kinds, settings.redact_phone_region), where)


def redacted_messages(
    deps: Services, user: Principal, messages: list[Any], count: bool = True
) -> tuple[list[Any], tuple[str, ...]]:
    """The user messages of a conversation as the policy keeps them (text content, or its text parts), and the
    kinds taken out of any of them (`count`: in the metric and the log)."""
    kinds = deps.policies.for_tier(user.tier).redact
    if not kinds:
        return messages, ()
    region, found, out = deps.settings.redact_phone_region, set(), []
    for message in messages:
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, str):
            kept = redact(content, kinds, region)
            found |= set(kept.kinds)
            message = {**message, "content": kept.text}
        elif message.get("role") == "user" and isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    kept = redact(part["text"], kinds, region)
                    found |= set(kept.kinds)
                    part = {**part, "text": kept.text}
                parts.append(part)
            message = {**message, "content": parts}
        out.append(message)
    taken = tuple(k for k in KINDS if k in found)
    if count:
        counted(user, Redacted("", taken), "request")
    return out, taken


def notice(run_id: str, message_id: str, kept: Redacted) -> dict[str, Any]:
    """The chat stream's first event when something was taken out: the message as kept, and what went."""
    data = {
        "run_id": run_id,
        "message_id": message_id,
        "content": kept.text,
        "kinds": list(kept.kinds),
    }
    return {"event": "message.redacted", "data": json.dumps(data)}
