"""What a summary run reads (pure): which of a chat's oldest unsummarised messages it folds in, and its prompt.
The memory stage asks for it (processors/remember.py); design: docs/decisions/0008-conversation-memory.md."""

from __future__ import annotations

from conversation import tokens
from storage.rows import Message
from topics.events import ChatMessage

# SmolLM2-135M summarises best (of the prompts tried, docs/decisions/0008-conversation-memory.md) with the
# conversation first and one plain instruction after it, no system prompt.
INSTRUCTION = (
    "Write a short summary of the facts the user shared about themselves in the conversation above (names, "
    "numbers, places, plans), keeping every fact from the earlier summary."
)
MESSAGE_TOKENS = 300  # the most of one message a summary run reads
# a summary run's prompt besides the messages: the earlier summary, instruction, template
SUMMARY_OVERHEAD = 400


def fold(
    messages: list[Message],
    counts: list[int],
    after_tokens: int,
    keep_tokens: int,
    most_tokens: int,
) -> int:
    """How many of the oldest unsummarised messages to fold into the next summary (0: not yet) (pure).

    Nothing happens until the messages pass `after_tokens`; then all but the newest `keep_tokens` go, at most
    `most_tokens` of them (each message counted as the summary run reads it, cut to MESSAGE_TOKENS: a run's
    prompt must fit its model; a backlog is folded by successive versions), ending on an assistant message so
    a turn is never split."""
    if sum(counts) <= after_tokens:
        return 0
    kept, n = 0, len(messages)
    while n > 0 and kept + counts[n - 1] <= keep_tokens:
        n -= 1
        kept += counts[n]
    taken, cap = 0, 0
    while cap < n and taken + min(counts[cap], MESSAGE_TOKENS) <= most_tokens:
        taken += min(counts[cap], MESSAGE_TOKENS)
        cap += 1
    n = cap
    while n > 0 and messages[n - 1].role != "assistant":
        n -= 1
    return n


def summary_request(
    previous: str | None, messages: list[Message], counter: tokens.ChatTokenizer
) -> list[ChatMessage]:
    lines = [
        f"{m.role.capitalize()}: {counter.truncate(' '.join(m.content.split()), MESSAGE_TOKENS)}"
        for m in messages
    ]
    earlier = f"Earlier summary: {previous}\n\n" if previous else ""
    return [{"role": "user", "content": earlier + "\n".join(lines) + "\n\n" + INSTRUCTION}]
