"""A guard model served by an engine, for deployments that have one on their GPUs: Llama Guard 3 (or 4, which
answers in the same format) behind any OpenAI-compatible server (SGLang, vLLM), beside the embedded encoder,
which stays the default.

Set `PARLEY_GUARD_URL` (and `PARLEY_GUARD_MODEL`, the served name; `PARLEY_GUARD_API_KEY` if the server wants
one) and the checks of the categories the guard covers ask it instead of the encoder's heads:
harmful_request and toxic on prompts and context, harmful_output and toxic on answers. Prompt injection is
not what Llama Guard looks for (Meta's Prompt Guard is), so it stays with the encoder's head.

The protocol (Llama Guard 3's model card and chat template): the conversation goes as chat messages, and the
model's own template wraps it in its instructions and the S1-S14 taxonomy; the last turn is judged, so a
prompt goes as the user's turn and an answer as the assistant's. It answers `safe`, or `unsafe` and a line of
comma-separated categories (`unsafe\nS1,S10`). Each category maps onto Parley's, scored 1.0 when named and
0.0 otherwise, so a policy's thresholds and actions apply as they do to the heads' scores. Whatever else it
answers is an error, decided by the policy's on_error like any classifier failure.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import httpx

from runtime.settings import StackSettings
from safety.moderator import Moderator, read, with_rules

log = logging.getLogger(__name__)

# Llama Guard 3's hazard categories (MLCommons taxonomy), onto Parley's. A prompt that asks for a hazard is a
# harmful request; an answer that gives one is harmful output. Hate (S10) and sexual content (S12) are toxic.
HAZARDS = {
    "S1": "violent crimes",
    "S2": "non-violent crimes",
    "S3": "sex-related crimes",
    "S4": "child sexual exploitation",
    "S5": "defamation",
    "S6": "specialized advice",
    "S7": "privacy",
    "S8": "intellectual property",
    "S9": "indiscriminate weapons",
    "S10": "hate",
    "S11": "suicide and self-harm",
    "S12": "sexual content",
    "S13": "elections",
    "S14": "code interpreter abuse",
}
TOXIC = {"S10", "S12"}
HARMFUL = set(HAZARDS) - TOXIC
COVERED = ("harmful_request", "harmful_output", "toxic")
_VERDICT = re.compile(r"^\s*(safe|unsafe)\s*(?:\n\s*(S\d+(?:\s*,\s*S\d+)*))?\s*$")
# what the answer of a turn is judged with when the prompt is not at hand (an output window)
UNSEEN_PROMPT = "(the user's message)"


class GuardFormatError(ValueError):
    """The guard answered something that is not its verdict format."""


def parse(answer: str) -> set[str]:
    """The hazard categories a Llama Guard answer names (empty when it says safe)."""
    found = _VERDICT.match(answer)
    if found is None:
        raise GuardFormatError(f"not a Llama Guard verdict: {answer[:80]!r}")
    verdict, named = found.groups()
    hazards = {c.strip() for c in named.split(",")} if named else set()
    if verdict == "safe":
        return set()
    unknown = hazards - set(HAZARDS)
    if unknown or not hazards:
        raise GuardFormatError(f"unsafe without known categories: {answer[:80]!r}")
    return hazards


def scores_of(hazards: set[str], categories: Sequence[str]) -> dict[str, float]:
    """Parley's scores for the categories the guard covers, from the hazards it named."""
    named = {
        "harmful_request": bool(hazards & HARMFUL),
        "harmful_output": bool(hazards & HARMFUL),
        "toxic": bool(hazards & TOXIC),
    }
    return {c: 1.0 if named[c] else 0.0 for c in categories if c in named}


def messages(text: str, answer: bool) -> list[dict[str, str]]:
    """The conversation the guard judges: a prompt as the user's turn, an answer as the assistant's."""
    if answer:
        return [
            {"role": "user", "content": UNSEEN_PROMPT},
            {"role": "assistant", "content": text},
        ]
    return [{"role": "user", "content": text}]


class GuardModelModerator(Moderator):
    """The Moderator whose covered categories are judged by a guard model on an engine; the rest by the heads."""

    def __init__(
        self,
        url: str,
        model: str,
        api_key: str = "",
        timeout_s: float = 10.0,
        threads: int = 1,
        client: httpx.Client | None = None,
        workers: int = 1,
    ) -> None:
        super().__init__(threads, workers)
        self.url = url.rstrip("/")
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = client or httpx.Client(timeout=timeout_s, headers=headers)

    def judge(self, text: str, answer: bool) -> set[str]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages(text, answer),
            "temperature": 0.0,
            "max_tokens": 20,  # "unsafe" and a few categories
        }
        response = self.client.post(f"{self.url}/v1/chat/completions", json=body)
        response.raise_for_status()
        return parse(response.json()["choices"][0]["message"]["content"])

    def scores(
        self, texts: Sequence[str], categories: Sequence[str], windows: int, plain: bool = False
    ) -> dict[str, float]:
        guarded = [c for c in categories if c in COVERED]
        rest = [c for c in categories if c not in COVERED]
        scores = super().scores(texts, rest, windows, plain) if rest else {}
        present = read(texts, plain)
        if guarded:
            # `plain` is set for prompts and context, not for answers (Moderator.check)
            hazards: set[str] = set()
            if present:
                hazards = self.judge("\n\n".join(present), answer=not plain)
            scores |= with_rules(scores_of(hazards, guarded), present, guarded)
        return scores


def moderator_for(settings: StackSettings, threads: int = 1, workers: int = 1) -> Moderator:
    """The guard model when the deployment names one, else the embedded encoder's heads."""
    if not settings.guard_url:
        return Moderator(threads, workers)
    log.info("safety checks ask the guard model %s at %s", settings.guard_model, settings.guard_url)
    return GuardModelModerator(
        settings.guard_url,
        settings.guard_model,
        settings.guard_api_key.get_secret_value(),
        threads=threads,
        workers=workers,
    )
