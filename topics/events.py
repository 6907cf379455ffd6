"""The events, one TypedDict per record type, written by topics/events_gen.py from schemas/ (do not edit:
run `python -m topics.events_gen`). Every field is read-only (a changed event is a new dict: `{**e, k: v}`);
a field with a default may be left out by a writer; a timestamp is an int of epoch milliseconds. No
`from __future__ import annotations`: TypedDict reads NotRequired from the evaluated annotations."""

from collections.abc import Mapping, Sequence
from typing import Literal, NotRequired

from typing_extensions import ReadOnly, TypedDict


class Usage(TypedDict):
    prompt_tokens: ReadOnly[int]
    completion_tokens: ReadOnly[int]
    cached_tokens: NotRequired[ReadOnly[int]]


class ChatMessage(TypedDict):
    """One message of an assembled prompt."""

    role: ReadOnly[str]
    content: ReadOnly[str]
    tool_calls: NotRequired[ReadOnly[str | None]]
    tool_call_id: NotRequired[ReadOnly[str | None]]


class Source(TypedDict):
    """A passage of a chat's document that went into the prompt, numbered as the prompt cites it."""

    n: ReadOnly[int]
    document_id: ReadOnly[str]
    name: ReadOnly[str]
    place: ReadOnly[str]
    text: ReadOnly[str]


class ToolUse(TypedDict):
    """One call a run made to a tool of a registered MCP server, and what came back, as the model then read
    it."""

    call_id: ReadOnly[str]
    name: ReadOnly[str]
    arguments: ReadOnly[str]
    status: ReadOnly[str]
    content: ReadOnly[str]
    duration_ms: NotRequired[ReadOnly[float]]


class SummaryRequest(TypedDict):
    version: ReadOnly[int]
    through: ReadOnly[str]
    messages: ReadOnly[int]


class Instruction(TypedDict):
    source: ReadOnly[str]
    content: ReadOnly[str]


class Generation(TypedDict):
    """What the client asked of the decoding beside temperature (OpenAI's chat completions fields), passed to
    the engine."""

    top_p: NotRequired[ReadOnly[float | None]]
    seed: NotRequired[ReadOnly[int | None]]
    stop: NotRequired[ReadOnly[Sequence[str]]]
    presence_penalty: NotRequired[ReadOnly[float | None]]
    frequency_penalty: NotRequired[ReadOnly[float | None]]
    logit_bias: NotRequired[ReadOnly[Mapping[str, int]]]
    response_format: NotRequired[ReadOnly[str | None]]
    tools: NotRequired[ReadOnly[str | None]]
    tool_choice: NotRequired[ReadOnly[str | None]]
    parallel_tool_calls: NotRequired[ReadOnly[bool]]
    server_tools: NotRequired[ReadOnly[bool]]


class PromptAccepted(TypedDict):
    """The edge accepted a user message and opened a run for it. Keyed by chat_id."""

    event_id: ReadOnly[str]
    run_id: ReadOnly[str]
    chat_id: ReadOnly[str]
    user_id: ReadOnly[str]
    tier: ReadOnly[str]
    message_id: ReadOnly[str]
    content: ReadOnly[str]
    max_tokens: ReadOnly[int]
    model: NotRequired[ReadOnly[str | None]]
    reply_partition: ReadOnly[int]
    prev_run_id: NotRequired[ReadOnly[str | None]]
    messages: NotRequired[ReadOnly[Sequence[ChatMessage] | None]]
    temperature: NotRequired[ReadOnly[float | None]]
    store: NotRequired[ReadOnly[bool]]
    summary: NotRequired[ReadOnly[SummaryRequest | None]]
    parent_id: NotRequired[ReadOnly[str | None]]
    branched: NotRequired[ReadOnly[bool]]
    instructions: NotRequired[ReadOnly[Sequence[Instruction] | None]]
    memories: NotRequired[ReadOnly[bool]]
    documents: NotRequired[ReadOnly[bool]]
    generation: NotRequired[ReadOnly[Generation | None]]
    created_at: ReadOnly[int]


class AuditEvent(TypedDict):
    """One admin action, or one read of another person's data (a run, a conversation, a safety decision, usage),
    by whom, of whose, from where. Written by the edge before it answers; the metering stage keeps it in
    ClickHouse (audit_log), which only the owner and auditors read. Keyed by the actor."""

    event_id: ReadOnly[str]
    at: ReadOnly[int]
    actor: ReadOnly[str]
    actor_role: ReadOnly[str]
    action: ReadOnly[str]
    target_user: NotRequired[ReadOnly[str | None]]
    resource: ReadOnly[str]
    from_addr: ReadOnly[str]
    detail: NotRequired[ReadOnly[str]]


class Feedback(TypedDict):
    """A user's thumbs up or down on one answer (or taking it back). Kept in the log for evals; the persistence
    stage shows it on the stored answer. Keyed by chat_id."""

    event_id: ReadOnly[str]
    chat_id: ReadOnly[str]
    user_id: ReadOnly[str]
    message_id: ReadOnly[str]
    rating: ReadOnly[Literal["up", "down", "none"]]
    comment: NotRequired[ReadOnly[str | None]]
    model: NotRequired[ReadOnly[str | None]]
    at: ReadOnly[int]


class LimitsChanged(TypedDict):
    """An admin set a tier's limits or one user's. Keyed by 'tier:<name>' or 'user:<id>' on a compacted topic; a
    field left null keeps the value below it (user over tier over built-in default); a tombstone removes the
    key's override."""

    event_id: ReadOnly[str]
    scope: ReadOnly[Literal["tier", "user"]]
    name: ReadOnly[str]
    budget_tokens: NotRequired[ReadOnly[int | None]]
    refill_tokens_per_hour: NotRequired[ReadOnly[int | None]]
    max_concurrent: NotRequired[ReadOnly[int | None]]
    priority: NotRequired[ReadOnly[int | None]]
    max_queue_wait_s: NotRequired[ReadOnly[float | None]]
    slot_share: NotRequired[ReadOnly[float | None]]
    degrade: NotRequired[ReadOnly[bool | None]]
    max_runs_per_minute: NotRequired[ReadOnly[int | None]]
    models: NotRequired[ReadOnly[Sequence[str] | None]]
    changed_by: ReadOnly[str]
    changed_at: ReadOnly[int]


class MemoryChanged(TypedDict):
    """A user edited or deleted a message, reset a chat's context, deleted the chat, or attached or removed a
    document; or a person was erased (person_erased: chat_id empty, keyed by user_id; each of their chats was
    deleted before it). The edge has already recorded it beside the stored messages; the memory stage re-embeds,
    forgets and re-summarises, and persistence erases a deleted chat's messages. Keyed by chat_id."""

    event_id: ReadOnly[str]
    chat_id: ReadOnly[str]
    user_id: ReadOnly[str]
    action: ReadOnly[Literal["edited", "deleted", "reset", "chat_deleted", "document_added", "document_deleted", "person_erased"]]
    message_id: NotRequired[ReadOnly[str | None]]
    role: NotRequired[ReadOnly[str | None]]
    content: NotRequired[ReadOnly[str | None]]
    document_id: NotRequired[ReadOnly[str | None]]
    at: ReadOnly[int]


class ModeratedWindow(TypedDict):
    start: ReadOnly[int]
    end: ReadOnly[int]
    scores: ReadOnly[Mapping[str, float]]
    check_ms: ReadOnly[float]


class OutputModerated(TypedDict):
    """The output moderation of one run's streamed answer: every window checked with its scores, and the
    decision. Keyed by chat_id; written by the inference consumer that served the run."""

    event_id: ReadOnly[str]
    run_id: ReadOnly[str]
    chat_id: ReadOnly[str]
    user_id: ReadOnly[str]
    tier: ReadOnly[str]
    policy_version: ReadOnly[str]
    windows: ReadOnly[Sequence[ModeratedWindow]]
    action: NotRequired[ReadOnly[str | None]]
    category: NotRequired[ReadOnly[str | None]]
    retracted_from: NotRequired[ReadOnly[int | None]]
    error: NotRequired[ReadOnly[str | None]]
    moderated_at: ReadOnly[int]


class PersonKey(TypedDict):
    """A person's data key, wrapped by the key-encryption key: what seals the text of their records
    (topics/sealed.py, runtime/keys.py). Keyed by key_id in a compacted topic; erasing the person deletes it (a
    tombstone), and every copy of their text becomes unreadable."""

    key_id: ReadOnly[str]
    user_id: ReadOnly[str]
    kek_id: ReadOnly[str]
    wrapped: ReadOnly[bytes]
    created_at: ReadOnly[int]


class PoolStatus(TypedDict):
    """One inference consumer's load, published every quarter second. Keyed by worker_id."""

    worker_id: ReadOnly[str]
    pool: ReadOnly[str]
    slots: ReadOnly[int]
    healthy: ReadOnly[bool]
    running: ReadOnly[Mapping[str, int]]
    queued: ReadOnly[Mapping[str, int]]
    mean_run_s: ReadOnly[float]
    partitions: NotRequired[ReadOnly[Sequence[int]]]
    at: ReadOnly[int]


class PromptModerated(TypedDict):
    """The moderation stage's verdict on a prompt. Keyed by chat_id."""

    event_id: ReadOnly[str]
    prompt: ReadOnly[PromptAccepted]
    decision: ReadOnly[Literal["allowed", "blocked"]]
    category: NotRequired[ReadOnly[str | None]]
    reason: NotRequired[ReadOnly[str | None]]
    policy_version: NotRequired[ReadOnly[str]]
    scores: NotRequired[ReadOnly[Mapping[str, float]]]
    action: NotRequired[ReadOnly[str | None]]
    error: NotRequired[ReadOnly[str | None]]
    check_ms: NotRequired[ReadOnly[float]]
    moderated_at: ReadOnly[int]


class RunCompleted(TypedDict):
    """A run ended (stop, length, cancelled or error) with its full answer and usage. Keyed by chat_id."""

    event_id: ReadOnly[str]
    prompt: ReadOnly[PromptAccepted]
    pool: ReadOnly[str]
    model: ReadOnly[str]
    content: ReadOnly[str]
    finish_reason: ReadOnly[str]
    usage: ReadOnly[Usage]
    ttft_ms: ReadOnly[float]
    duration_ms: ReadOnly[float]
    error_message: NotRequired[ReadOnly[str | None]]
    served_by: NotRequired[ReadOnly[str]]
    itl_p50_ms: NotRequired[ReadOnly[float]]
    itl_p99_ms: NotRequired[ReadOnly[float]]
    queue_ms: NotRequired[ReadOnly[float]]
    moderation: NotRequired[ReadOnly[str]]
    memories: NotRequired[ReadOnly[Sequence[str]]]
    sources: NotRequired[ReadOnly[Sequence[Source]]]
    tools: NotRequired[ReadOnly[Sequence[ToolUse]]]
    completed_at: ReadOnly[int]


class RunControl(TypedDict):
    """A command to the inference consumer serving a run (today: cancel). Keyed by chat_id; every inference
    consumer reads the whole topic and acts on the runs it holds."""

    event_id: ReadOnly[str]
    run_id: ReadOnly[str]
    chat_id: ReadOnly[str]
    user_id: ReadOnly[str]
    action: ReadOnly[Literal["cancel"]]
    reason: NotRequired[ReadOnly[str]]
    requested_at: ReadOnly[int]


class RunRejected(TypedDict):
    """The run will not be served (blocked by moderation, over budget, over capacity). Written to the reply
    partition."""

    event_id: ReadOnly[str]
    prompt: ReadOnly[PromptAccepted]
    code: ReadOnly[str]
    message: ReadOnly[str]
    category: NotRequired[ReadOnly[str | None]]
    retry_after_s: NotRequired[ReadOnly[int | None]]
    rejected_at: ReadOnly[int]


class PromptContext(TypedDict):
    """What went into the prompt, so a replay shows exactly what the model saw."""

    budget: ReadOnly[int]
    prompt_tokens: ReadOnly[int]
    summary_version: NotRequired[ReadOnly[int | None]]
    summary_through: NotRequired[ReadOnly[str | None]]
    summary_tokens: NotRequired[ReadOnly[int]]
    verbatim_ids: NotRequired[ReadOnly[Sequence[str]]]
    retrieved_ids: NotRequired[ReadOnly[Sequence[str]]]
    retrieved_tokens: NotRequired[ReadOnly[int]]
    message_tokens: NotRequired[ReadOnly[int]]
    withheld_ids: NotRequired[ReadOnly[Sequence[str]]]
    instructions: NotRequired[ReadOnly[Sequence[str]]]
    instruction_tokens: NotRequired[ReadOnly[int]]
    memory_ids: NotRequired[ReadOnly[Sequence[str]]]
    memories: NotRequired[ReadOnly[Sequence[str]]]
    memory_tokens: NotRequired[ReadOnly[int]]
    sources: NotRequired[ReadOnly[Sequence[Source]]]
    document_tokens: NotRequired[ReadOnly[int]]


class RunScheduled(TypedDict):
    """The scheduler admitted a run, chose its pool and assembled its context. Keyed by chat_id."""

    event_id: ReadOnly[str]
    prompt: ReadOnly[PromptAccepted]
    pool: ReadOnly[str]
    model: ReadOnly[str]
    messages: ReadOnly[Sequence[ChatMessage]]
    context_turns: NotRequired[ReadOnly[int]]
    priority: NotRequired[ReadOnly[int]]
    degraded_from: NotRequired[ReadOnly[str | None]]
    estimate_tokens: NotRequired[ReadOnly[int]]
    context: NotRequired[ReadOnly[PromptContext | None]]
    rescheduled: NotRequired[ReadOnly[bool]]
    scheduled_at: ReadOnly[int]


class SafetyRule(TypedDict):
    stage: ReadOnly[str]
    category: ReadOnly[str]
    threshold: ReadOnly[float]
    action: ReadOnly[str]


class SafetyPolicy(TypedDict):
    """The safety policy of one tier ('*': every tier without its own). Keyed by the tier on a compacted topic;
    a tombstone returns the tier to '*' (or the built-in policy). Every moderation decision names the version it
    applied."""

    event_id: ReadOnly[str]
    tier: ReadOnly[str]
    version: ReadOnly[str]
    rules: ReadOnly[Sequence[SafetyRule]]
    on_error: NotRequired[ReadOnly[str]]
    redact: NotRequired[ReadOnly[Sequence[str]]]
    changed_by: ReadOnly[str]
    changed_at: ReadOnly[int]


class TokenDelta(TypedDict):
    """One record of a run's reply stream, written to the reply partition the run names: queued (by the
    scheduler), then started, deltas and the end (by the inference consumer). Deltas are coalesced (a few ms or
    tokens per record)."""

    run_id: ReadOnly[str]
    chat_id: ReadOnly[str]
    seq: ReadOnly[int]
    kind: ReadOnly[Literal["started", "delta", "completed", "error", "queued", "moderation"]]
    text: NotRequired[ReadOnly[str]]
    model: NotRequired[ReadOnly[str | None]]
    finish_reason: NotRequired[ReadOnly[str | None]]
    usage: NotRequired[ReadOnly[Usage | None]]
    error_code: NotRequired[ReadOnly[str | None]]
    error_message: NotRequired[ReadOnly[str | None]]
    tokens: NotRequired[ReadOnly[int | None]]
    pool: NotRequired[ReadOnly[str | None]]
    estimated_wait_ms: NotRequired[ReadOnly[int | None]]
    degraded_from: NotRequired[ReadOnly[str | None]]
    category: NotRequired[ReadOnly[str | None]]
    retract_from: NotRequired[ReadOnly[int | None]]
    memories: NotRequired[ReadOnly[Sequence[str]]]
    sources: NotRequired[ReadOnly[Sequence[Source]]]
    tool_calls: NotRequired[ReadOnly[str | None]]
    tool_result: NotRequired[ReadOnly[ToolUse | None]]
    emitted_at: ReadOnly[int]
    user_id: NotRequired[ReadOnly[str | None]]


class ToolServer(TypedDict):
    """An MCP server an admin registered, with the tools it listed when registered and who may use them. Keyed
    by the server's name on a compacted topic; a tombstone removes it."""

    event_id: ReadOnly[str]
    name: ReadOnly[str]
    url: ReadOnly[str]
    auth_env: NotRequired[ReadOnly[str | None]]
    roles: ReadOnly[Sequence[str]]
    tools: ReadOnly[str]
    timeout_s: ReadOnly[float]
    max_result_bytes: ReadOnly[int]
    changed_by: ReadOnly[str]
    changed_at: ReadOnly[int]
