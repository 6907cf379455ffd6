"""What a person set for their chats, applied to a run as the edge opens it: the model (the message's own, else
the chat's, else the deployment's default) checked against the person's tier, and the instructions (the
person's, then the chat's) carried in the prompt event, where the scheduler counts them within the budget and
screens them (conversation/gather.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from admission.limits import LimitsView, allowed_default, model_refusal
from api.auth import Principal
from api.deps import Services
from api.errors import ApiError
from api.settings import ApiSettings
from conversation import tokens
from storage.preferences import ChatSettings
from topics.events import Instruction


def checked_instructions(settings: ApiSettings, content: str) -> str:
    """Instructions as stored: trimmed, at most `max_instruction_tokens` (400 instructions_too_long)."""
    content = content.strip()
    counter = tokens.load(settings.pools[settings.default_pool].tokenizer)
    used, limit = counter.count(content), settings.max_instruction_tokens
    if used > limit:
        raise ApiError(
            400,
            f"Instructions may take at most {limit} tokens; these take {used}. Shorten them.",
            "instructions_too_long",
            "instructions",
        )
    return content


def allowed_model(
    settings: ApiSettings, views: LimitsView, user: Principal, model: str | None
) -> str | None:
    """The model a run of this person goes to (None: the deployment's default): 400 for a model not served, 403
    model_not_allowed for one their tier may not use."""
    if model is not None and model not in settings.models:
        raise ApiError(400, f"Unknown model '{model}'.", "model_not_found", "model")
    limits = views.for_user(user.user_id, user.tier)
    if model is None:
        return allowed_default(limits, settings.models[0])
    refusal = model_refusal(limits, model, user.tier)
    if refusal:
        raise ApiError(403, refusal, "model_not_allowed", "model")
    return model


@dataclass(frozen=True)
class ForRun:
    model: str | None  # None: the deployment's default
    instructions: list[Instruction]
    memories_on: bool  # the deployment's switch and the person's (api/memories.py)
    memories: bool  # and they keep some: recall them


async def for_run(deps: Services, user: Principal, chat: ChatSettings, model: str | None) -> ForRun:
    """What a message in a chat with these settings runs with; `model`: the one the message asked for."""
    chosen = allowed_model(deps.settings, deps.limits, user, model or chat.model)
    person = deps.preferences.person(user.user_id)  # instructions and switches: one row
    if deps.settings.memories:  # and whether they keep any memory, beside it
        (own, _, mine), kept = await asyncio.gather(person, deps.memories.kept(user.user_id, 1))
    else:
        (own, _, mine), kept = await person, []
    on = deps.settings.memories and mine.memories
    instructions: list[Instruction] = [
        {"source": source, "content": text}
        for source, text in (("person", own), ("chat", chat.instructions))
        if text
    ]
    return ForRun(chosen, instructions, on, on and bool(kept))
