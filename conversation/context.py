"""Prompt assembly within a token budget (pure): docs/decisions/0008-conversation-memory.md.

A chat prompt is laid out so its front changes rarely and in blocks (engine prefix caching keeps working):

    system:  the system prompt, then the rolling summary of older turns      (changes when a summary lands)
    user/assistant: the turns after the summary, verbatim, oldest first      (grows by one turn per turn)
    user:    the retrieved older messages relevant to this one, then the new message   (changes every turn)

Tokens are counted with the serving model's tokenizer over the chat template's rendering, so the recorded
count is what the engine sees. The verbatim window takes whole messages, newest first, from what is left
after the system prompt, summary, retrieval reserve and new message; a message that does not fit ends it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from topics.events import ChatMessage

SUMMARY_HEADER = "\n\nSummary of the earlier conversation:\n"
RECALL_HEADER = "Earlier in this conversation (recalled):\n"
RECALL_FOOTER = "\n\nNew message:\n"


class Tokens(Protocol):
    def count(self, text: str) -> int: ...
    def count_chat(self, messages: Sequence[Mapping[str, Any]]) -> int: ...
    def truncate(self, text: str, tokens: int) -> str: ...


@dataclass(frozen=True)
class Turn:
    """A message as assembly sees it (earlier turns, retrieved ones, the summary)."""

    id: str
    role: str
    content: str


@dataclass(frozen=True)
class Limits:
    budget: int  # the prompt's tokens, template included
    summary_tokens: int = 256  # the most a summary may take
    recall_tokens: int = 320  # reserved for retrieved messages when there are older ones
    recall_item_tokens: int = 120  # the most one retrieved message may take


@dataclass
class Assembled:
    messages: list[ChatMessage]
    record: dict[str, Any] = field(default_factory=dict)  # RunScheduled.context: what the model saw
    # the tokens of the largest earlier turn the window let go (pool choice)
    largest_dropped: int = 0


class TooLong(Exception):
    pass


def _per_message(tokens: Tokens) -> int:
    """The template's tokens around one message (role markers, separators)."""
    empty = [{"role": "user", "content": ""}]
    return tokens.count_chat(empty + empty) - tokens.count_chat(empty)


def costs(turns: list[Turn], tokens: Tokens) -> list[int]:
    """Each turn's tokens in a prompt: its text and the template's tokens around it."""
    overhead = _per_message(tokens)
    return [tokens.count(t.content) + overhead for t in turns]


def window(turns: list[Turn], cost: list[int], room: int) -> int:
    """Where the window starts: the newest turns from there fit in `room`, start with a user turn, and the
    start moves in blocks.

    A window that dropped its oldest turn at every new turn would change the prompt right after the system
    message every time, and the engine's prefix cache would miss on every turn once the window is full.
    So the window may only start at fixed anchors: user turns where the running token count from the first
    of `turns` (the turn after the summary: a fixed origin) crosses a multiple of half the room. When the
    turns outgrow the room, the start jumps to the next anchor that fits, dropping about half a room at once;
    in between, prompts only grow at their end."""
    step = max(1, room // 2)
    anchors, total, mark = set(), 0, 0
    for i, turn in enumerate(turns):
        if turn.role == "user" and total >= mark:
            anchors.add(i)
            mark = (total // step + 1) * step
        total += cost[i]
    suffix = total
    for i in range(len(turns)):
        if i in anchors and suffix <= room:
            return i
        suffix -= cost[i]
    # Nothing from an anchor fits (one huge turn): the newest whole turns that do, starting with a user turn.
    start, used = len(turns), 0
    while start > 0 and used + cost[start - 1] <= room:
        start -= 1
        used += cost[start]
    while start < len(turns) and turns[start].role != "user":
        start += 1
    return start


def relevant(
    query: np.ndarray, texts: list[str], vectors: np.ndarray, k: int, floor: float, weight: float
) -> list[int]:
    """Which candidates to recall, best first (indexes into `texts`): maximal marginal relevance.

    Candidates below the cosine `floor` are not relevant enough to spend tokens on; repeated texts count once.
    The rest are taken one at a time by `weight` * similarity to the query - (1 - `weight`) * the highest
    similarity to one already taken, so the earlier questions about a fact (and wrong answers to them) do
    not crowd out the message that states it. Vectors are unit length (cosine is a dot product)."""
    if not texts:
        return []
    to_query = vectors @ query
    seen: set[str] = set()
    pool = []
    for i, text in enumerate(texts):
        key = " ".join(text.split()).lower()
        if to_query[i] >= floor and key not in seen:
            seen.add(key)
            pool.append(i)
    chosen: list[int] = []
    while pool and len(chosen) < k:

        def score(i: int) -> float:
            overlap = max((float(vectors[i] @ vectors[j]) for j in chosen), default=0.0)
            return weight * float(to_query[i]) - (1 - weight) * overlap

        best = max(pool, key=score)
        chosen.append(best)
        pool.remove(best)
    return chosen


def recall_block(
    recalled: list[Turn], room: int, limits: Limits, tokens: Tokens
) -> tuple[str, list[Turn]]:
    """The retrieved messages as one block (chronological), each cut to its share; best first until full."""
    chosen: list[tuple[Turn, str]] = []
    used = tokens.count(RECALL_HEADER + RECALL_FOOTER)
    for turn in recalled:  # best first
        text = tokens.truncate(" ".join(turn.content.split()), limits.recall_item_tokens)
        line = f"{turn.role.capitalize()}: {text}\n"
        cost = tokens.count(line)
        if used + cost > room:
            continue
        chosen.append((turn, line))
        used += cost
    if not chosen:
        return "", []
    ordered = sorted(chosen, key=lambda pair: uuid.UUID(pair[0].id).time)
    return RECALL_HEADER + "".join(line for _, line in ordered).rstrip("\n") + RECALL_FOOTER, [
        t for t, _ in ordered
    ]


def assemble_chat(
    system_prompt: str,
    summary: tuple[int, str, str] | None,  # (version, through, text)
    earlier: list[
        Turn
    ],  # the turns after the summary (and any reset), oldest first, not the new message
    older_exist: bool,  # whether there are turns before `earlier` (summarised, or out of the window)
    recalled: list[Turn] | None,  # retrieved older turns, best first (None: retrieval not done yet)
    new_message: str,
    limits: Limits,
    tokens: Tokens,
) -> Assembled:
    """The prompt for a new message; raises TooLong when the system prompt and the message alone overflow."""
    bare: list[ChatMessage] = [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": new_message},
    ]
    floor = tokens.count_chat(bare)
    if floor > limits.budget:
        raise TooLong(
            f"This message needs {floor} prompt tokens; this model's budget is {limits.budget}."
        )
    system, summary_tokens = system_prompt, 0
    if summary is not None:
        text = tokens.truncate(summary[2].strip(), limits.summary_tokens)
        candidate = system_prompt + SUMMARY_HEADER + text
        summary_tokens = tokens.count(candidate) - tokens.count(system_prompt)
        if floor + summary_tokens <= limits.budget:
            system = candidate
        else:
            summary, summary_tokens = None, 0
    fixed = floor + summary_tokens
    room = limits.budget - fixed
    # Room for recalled messages is kept whenever there is anything older than the window, whatever this
    # message recalls: the window (the cached prefix) must not move with each message's retrieval.
    cost = costs(earlier, tokens)
    overflow = older_exist or sum(cost) > room
    start = window(
        earlier, cost, room - (min(limits.recall_tokens, limits.budget // 5) if overflow else 0)
    )
    kept = earlier[start:]
    block, used = "", list[Turn]()
    if recalled:
        block, used = recall_block(recalled, max(0, room - sum(cost[start:])), limits, tokens)
    messages: list[ChatMessage] = [{"role": "system", "content": system}]
    messages += [{"role": t.role, "content": t.content} for t in kept]
    messages.append({"role": "user", "content": block + new_message})
    total = tokens.count_chat(messages)
    while (
        total > limits.budget and len(messages) > 2
    ):  # the per-part sums are close, not exact: trim to fit
        messages.pop(1)
        kept = kept[1:]
        total = tokens.count_chat(messages)
    if total > limits.budget:  # only the recalled block is left to give up
        block, used = "", []
        messages[-1] = {"role": "user", "content": new_message}
        total = tokens.count_chat(messages)
    record = {
        "budget": limits.budget,
        "prompt_tokens": total,
        "summary_version": summary[0] if summary else None,
        "summary_through": summary[1] if summary else None,
        "summary_tokens": summary_tokens,
        "verbatim_ids": [t.id for t in kept],
        "retrieved_ids": [t.id for t in used],
        "retrieved_tokens": tokens.count(block) if block else 0,
        "message_tokens": tokens.count(new_message),
    }
    return Assembled(messages, record, max(cost[: len(earlier) - len(kept)], default=0))
