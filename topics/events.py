"""The events, one TypedDict per record type, written by topics/events_gen.py from schemas/ (do not edit:
run `python -m topics.events_gen`). A field with a default may be left out by a writer; a timestamp is
an int of epoch milliseconds. No `from __future__ import annotations`: TypedDict reads NotRequired from
the evaluated annotations."""

from typing import Literal, NotRequired, TypedDict


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: NotRequired[int]


class ChatMessage(TypedDict):
    """One message of an assembled prompt."""

    role: str
    content: str


class SummaryRequest(TypedDict):
    version: int
    through: str
    messages: int


class PromptAccepted(TypedDict):
    """The edge accepted a user message and opened a run for it. Keyed by chat_id."""

    event_id: str
    run_id: str
    chat_id: str
    user_id: str
    tier: str
    message_id: str
    content: str
    max_tokens: int
    model: NotRequired[str | None]
    reply_partition: int
    prev_run_id: NotRequired[str | None]
    messages: NotRequired[list[ChatMessage] | None]
    temperature: NotRequired[float | None]
    store: NotRequired[bool]
    summary: NotRequired[SummaryRequest | None]
    created_at: int


class Feedback(TypedDict):
    """A user's thumbs up or down on one answer (or taking it back). Kept in the log for evals; the persistence
    stage shows it on the stored answer. Keyed by chat_id."""

    event_id: str
    chat_id: str
    user_id: str
    message_id: str
    rating: Literal["up", "down", "none"]
    comment: NotRequired[str | None]
    model: NotRequired[str | None]
    at: int


class LimitsChanged(TypedDict):
    """An admin set a tier's limits or one user's. Keyed by 'tier:<name>' or 'user:<id>' on a compacted topic; a
    field left null keeps the value below it (user over tier over built-in default); a tombstone removes the
    key's override."""

    event_id: str
    scope: Literal["tier", "user"]
    name: str
    budget_tokens: NotRequired[int | None]
    refill_tokens_per_hour: NotRequired[int | None]
    max_concurrent: NotRequired[int | None]
    priority: NotRequired[int | None]
    max_queue_wait_s: NotRequired[float | None]
    slot_share: NotRequired[float | None]
    degrade: NotRequired[bool | None]
    changed_by: str
    changed_at: int


class MemoryChanged(TypedDict):
    """A user edited or deleted a message, reset a chat's context or deleted the chat. The edge has already
    recorded it beside the stored messages; the memory stage re-embeds, forgets and re-summarises, and
    persistence erases a deleted chat's messages. Keyed by chat_id."""

    event_id: str
    chat_id: str
    user_id: str
    action: Literal["edited", "deleted", "reset", "chat_deleted"]
    message_id: NotRequired[str | None]
    role: NotRequired[str | None]
    content: NotRequired[str | None]
    at: int


class ModeratedWindow(TypedDict):
    start: int
    end: int
    scores: dict[str, float]
    check_ms: float


class OutputModerated(TypedDict):
    """The output moderation of one run's streamed answer: every window checked with its scores, and the
    decision. Keyed by chat_id; written by the inference consumer that served the run."""

    event_id: str
    run_id: str
    chat_id: str
    user_id: str
    tier: str
    policy_version: str
    windows: list[ModeratedWindow]
    action: NotRequired[str | None]
    category: NotRequired[str | None]
    retracted_from: NotRequired[int | None]
    error: NotRequired[str | None]
    moderated_at: int


class PoolStatus(TypedDict):
    """One inference consumer's load, published every quarter second. Keyed by worker_id."""

    worker_id: str
    pool: str
    slots: int
    healthy: bool
    running: dict[str, int]
    queued: dict[str, int]
    mean_run_s: float
    partitions: NotRequired[list[int]]
    at: int


class PromptModerated(TypedDict):
    """The moderation stage's verdict on a prompt. Keyed by chat_id."""

    event_id: str
    prompt: PromptAccepted
    decision: Literal["allowed", "blocked"]
    category: NotRequired[str | None]
    reason: NotRequired[str | None]
    policy_version: NotRequired[str]
    scores: NotRequired[dict[str, float]]
    action: NotRequired[str | None]
    error: NotRequired[str | None]
    check_ms: NotRequired[float]
    moderated_at: int


class RunCompleted(TypedDict):
    """A run ended (stop, length, cancelled or error) with its full answer and usage. Keyed by chat_id."""

    event_id: str
    prompt: PromptAccepted
    pool: str
    model: str
    content: str
    finish_reason: str
    usage: Usage
    ttft_ms: float
    duration_ms: float
    error_message: NotRequired[str | None]
    served_by: NotRequired[str]
    itl_p50_ms: NotRequired[float]
    itl_p99_ms: NotRequired[float]
    queue_ms: NotRequired[float]
    moderation: NotRequired[str]
    completed_at: int


class RunControl(TypedDict):
    """A command to the inference consumer serving a run (today: cancel). Keyed by chat_id; every inference
    consumer reads the whole topic and acts on the runs it holds."""

    event_id: str
    run_id: str
    chat_id: str
    user_id: str
    action: Literal["cancel"]
    reason: NotRequired[str]
    requested_at: int


class RunRejected(TypedDict):
    """The run will not be served (blocked by moderation, over budget, over capacity). Written to the reply
    partition."""

    event_id: str
    prompt: PromptAccepted
    code: str
    message: str
    category: NotRequired[str | None]
    retry_after_s: NotRequired[int | None]
    rejected_at: int


class PromptContext(TypedDict):
    """What went into the prompt, so a replay shows exactly what the model saw."""

    budget: int
    prompt_tokens: int
    summary_version: NotRequired[int | None]
    summary_through: NotRequired[str | None]
    summary_tokens: NotRequired[int]
    verbatim_ids: NotRequired[list[str]]
    retrieved_ids: NotRequired[list[str]]
    retrieved_tokens: NotRequired[int]
    message_tokens: NotRequired[int]
    withheld_ids: NotRequired[list[str]]


class RunScheduled(TypedDict):
    """The scheduler admitted a run, chose its pool and assembled its context. Keyed by chat_id."""

    event_id: str
    prompt: PromptAccepted
    pool: str
    model: str
    messages: list[ChatMessage]
    context_turns: NotRequired[int]
    priority: NotRequired[int]
    degraded_from: NotRequired[str | None]
    estimate_tokens: NotRequired[int]
    context: NotRequired[PromptContext | None]
    rescheduled: NotRequired[bool]
    scheduled_at: int


class SafetyRule(TypedDict):
    stage: str
    category: str
    threshold: float
    action: str


class SafetyPolicy(TypedDict):
    """The safety policy of one tier ('*': every tier without its own). Keyed by the tier on a compacted topic;
    a tombstone returns the tier to '*' (or the built-in policy). Every moderation decision names the version it
    applied."""

    event_id: str
    tier: str
    version: str
    rules: list[SafetyRule]
    on_error: NotRequired[str]
    changed_by: str
    changed_at: int


class TokenDelta(TypedDict):
    """One record of a run's reply stream, written to the reply partition the run names: queued (by the
    scheduler), then started, deltas and the end (by the inference consumer). Deltas are coalesced (a few ms or
    tokens per record)."""

    run_id: str
    chat_id: str
    seq: int
    kind: Literal["started", "delta", "completed", "error", "queued", "moderation"]
    text: NotRequired[str]
    model: NotRequired[str | None]
    finish_reason: NotRequired[str | None]
    usage: NotRequired[Usage | None]
    error_code: NotRequired[str | None]
    error_message: NotRequired[str | None]
    tokens: NotRequired[int | None]
    pool: NotRequired[str | None]
    estimated_wait_ms: NotRequired[int | None]
    degraded_from: NotRequired[str | None]
    category: NotRequired[str | None]
    retract_from: NotRequired[int | None]
    emitted_at: int
