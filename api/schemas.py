"""What the routes answer, as pydantic models: FastAPI checks each answer against its route's model and writes
the OpenAPI document from them (api/openapi.py adds only what settings decide at start). Times are ISO 8601
strings, as the stores give them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from admission.limits import Limits
from api.memories import MemoryOut
from safety.policy import Policy
from storage.api_keys import ApiKey
from storage.decisions import SafetyDecision
from storage.ids import utc
from storage.preferences import Marks
from storage.rows import Message


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """Every error the edge sends, in OpenAI's shape."""

    error: ErrorDetail


class SourceOut(BaseModel):
    n: int = Field(description="its number in the prompt: the answer cites [n]")
    document_id: str
    name: str = Field(description="the document's file name")
    place: str = Field(description="page 3, slide 2, sheet Budget, a heading, or empty")
    text: str = Field(description="the passage")


class ToolUseOut(BaseModel):
    call_id: str
    name: str = Field(description="the tool, as <server>__<tool>")
    arguments: str = Field(description="as the model wrote them (JSON)")
    status: str = Field(description="ok, error, timeout, too_large, unavailable or blocked")
    content: str = Field(description="the result the model read (or what it was told instead)")
    duration_ms: float


class MessageOut(BaseModel):
    id: str
    role: str
    content: str
    created_at: str
    run_id: str | None = Field(description="the run that answered (an answer's id is its run's)")
    model: str | None
    pool: str | None
    finish_reason: str | None
    feedback: str | None = Field(description="the owner's rating of an answer: up, down or null")
    parent_id: str | None = Field(
        None, description="the message it follows on its branch; null at the chat's root"
    )
    sibling_ids: list[str] = Field(
        default_factory=list,
        description="the messages sharing its parent, itself included, oldest first (other versions of a "
        "question or an answer)",
    )
    memories: list[str] = Field(
        default_factory=list, description="an answer's: the memories it recalled"
    )
    sources: list[SourceOut] = Field(
        default_factory=list,
        description="an answer's: the passages of the chat's documents its context held, numbered as it "
        "cites them ([n])",
    )
    tools: list[ToolUseOut] = Field(
        default_factory=list,
        description="an answer's: its calls to registered tools and their results",
    )

    @classmethod
    def of(
        cls, m: Message, parent_id: str | None = None, sibling_ids: list[str] | None = None
    ) -> MessageOut:
        return cls(
            id=m.id,
            role=m.role,
            content=m.content,
            created_at=m.created_at.isoformat(),
            run_id=m.run_id,
            model=m.model,
            pool=m.pool,
            finish_reason=m.finish_reason,
            feedback=m.feedback,
            parent_id=parent_id,
            sibling_ids=sibling_ids or [m.id],
            memories=list(m.memories),
            sources=[SourceOut(**s) for s in m.sources],
            tools=[ToolUseOut(**u) for u in m.tools],
        )


class MessagePage(BaseModel):
    data: list[MessageOut]
    next_cursor: str | None


class BranchOut(BaseModel):
    message_id: str = Field(description="the message the branch was chosen by")
    leaf_id: str = Field(description="the branch's last message: a new message follows it")


class ChatOut(BaseModel):
    id: str
    object: Literal["chat"] = "chat"
    title: str
    created_at: str
    last_active_at: str
    pinned: bool = Field(False, description="listed first")
    archived: bool = Field(False, description="listed only with ?archived=true")

    @classmethod
    def of(cls, row: Any, marks: Marks | None = None) -> ChatOut:
        """From a chat row, or a row of the owner's chats by activity (which names its time `active_at`)."""
        active = row.last_active_at if hasattr(row, "last_active_at") else row.active_at
        return cls(
            id=str(row.chat_id),
            title=row.title,
            created_at=utc(row.created_at).isoformat(),
            last_active_at=utc(active or row.created_at).isoformat(),
            pinned=bool(marks and marks.pinned),
            archived=bool(marks and marks.archived),
        )


class ChatDetail(ChatOut):
    active_run_id: str | None = Field(
        description="the latest run while it is still answering: a reloaded page resumes it"
    )
    instructions: str = Field("", description="the chat's own instructions, after the person's")
    model: str | None = Field(None, description="the chat's model; null: the deployment's default")


class Instructions(BaseModel):
    content: str = Field(description="the person's instructions for every chat; empty: none")
    updated_at: str | None = None


class ChatPage(BaseModel):
    data: list[ChatOut]
    next_cursor: str | None


class ChatExport(ChatOut):
    messages: list[MessageOut]


class Export(BaseModel):
    object: Literal["export"] = "export"
    user_id: str
    exported_at: str
    chats: list[ChatExport]
    memories: list[MemoryOut] = Field(
        default_factory=list, description="what they asked Parley to remember"
    )


class ContextReset(BaseModel):
    id: str
    object: Literal["chat.context"] = "chat.context"
    context_from: str = Field(description="the marker's id: later prompts carry nothing before it")


class Cancelling(BaseModel):
    id: str
    object: Literal["run"] = "run"
    status: Literal["cancelling"] = "cancelling"


class FeedbackOut(BaseModel):
    id: str
    object: Literal["feedback"] = "feedback"
    rating: Literal["up", "down"] | None


def iso(value: datetime | None) -> str | None:
    """An optional moment as ISO 8601."""
    return value.isoformat() if value else None


class ApiKeyOut(BaseModel):
    id: str
    object: Literal["api_key"] = "api_key"
    name: str
    prefix: str = Field(description="the key's first characters, to tell keys apart")
    tier: str
    scopes: list[str] = Field(
        description="chat, openai, usage, admin: the routes it may be used on"
    )
    created_at: str
    expires_at: str | None = Field(description="null: until revoked")
    last_used_at: str | None = Field(description="recorded at most once a minute per edge replica")
    revoked_at: str | None

    @classmethod
    def of(cls, key: ApiKey) -> ApiKeyOut:
        return cls(
            id=key.key_id,
            name=key.name,
            prefix=key.prefix,
            tier=key.tier,
            scopes=sorted(key.scopes),
            created_at=key.created_at.isoformat(),
            expires_at=iso(key.expires_at),
            last_used_at=iso(key.last_used_at),
            revoked_at=iso(key.revoked_at),
        )


class NewApiKey(ApiKeyOut):
    key: str = Field(description="the key itself: returned this once, never again")


class ApiKeyList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ApiKeyOut]


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "parley"
    description: str = ""
    context_length: int = Field(0, description="tokens: prompt and answer together")
    allowed: bool = Field(True, description="whether the caller's tier may use it")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


class Me(BaseModel):
    object: Literal["user"] = "user"
    user_id: str
    tier: str
    admin: bool
    via_key: bool
    role: str = Field("member", description="owner, admin, auditor or member")
    name: str | None = Field(None, description="the name the identity provider gives")
    csrf_token: str | None = Field(
        None, description="signed in by a browser session: send it in X-CSRF-Token on every change"
    )


class Budget(BaseModel):
    budget_tokens: int
    refill_tokens_per_hour: int
    in_flight: int
    max_concurrent: int


class Usage(BaseModel):
    user_id: str
    tier: str
    runs: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    total_tokens: int
    cost_usd: float
    period_start: str = Field(description="the start of this period: the calendar month, UTC")
    period_tokens: int = Field(description="prompt and completion tokens since period_start")
    remaining_budget: int = Field(description="tokens the budget lets the caller spend now")
    budget: Budget


class Alive(BaseModel):
    status: Literal["ok"] = "ok"


class Ready(BaseModel):
    status: Literal["ok", "no_reply_partition"]
    reply_partitions: list[int]


class LimitsList(BaseModel):
    tiers: dict[str, Limits] = Field(description="each tier's limits in effect")
    users: dict[str, dict[str, Any]] = Field(description="each user's own overrides")


class TierLimits(BaseModel):
    tier: str
    limits: Limits


class UserOverrides(BaseModel):
    user_id: str
    overrides: dict[str, Any]


class UserBudget(BaseModel):
    user_id: str
    remaining_budget: int
    in_flight: list[str] = Field(description="the user's runs holding budget now")
    limits: Limits


class AccessRevoked(BaseModel):
    user_id: str
    revoked_keys: int = Field(description="how many live API keys were revoked")
    ended_sessions: int = Field(0, description="how many browser sessions were ended")


class PolicyList(BaseModel):
    effective: dict[str, Policy] = Field(description="the policy each tier runs under now")
    set: list[str] = Field(description="the tiers with a policy set on the topic ('*': every tier)")


class TierPolicy(BaseModel):
    tier: str
    policy: Policy


class Decision(BaseModel):
    id: str
    at: str
    stage: str
    action: str
    category: str
    score: float | None
    policy_version: str
    run_id: str
    chat_id: str
    user_id: str
    tier: str
    excerpt: str = Field(description="the start of the text decided on")

    @classmethod
    def of(cls, d: SafetyDecision) -> Decision:
        return cls(
            id=str(d.decision_id),
            at=d.at.isoformat(),
            stage=d.stage,
            action=d.action,
            category=d.category,
            score=d.score,
            policy_version=d.policy_version,
            run_id=d.run_id,
            chat_id=d.chat_id,
            user_id=d.user_id,
            tier=d.tier,
            excerpt=d.excerpt,
        )


class DecisionPage(BaseModel):
    data: list[Decision]


class AuditEntry(BaseModel):
    event_id: str
    at: str
    actor: str
    actor_role: str
    action: str = Field(
        description="e.g. read.run, read.usage, limits.set_user, access.revoke, people.disable"
    )
    target_user: str = Field(description="whose data or access it touched (empty: no one person's)")
    resource: str
    from_addr: str
    detail: str = Field(description="the change, as JSON (empty for a read)")


class AuditPage(BaseModel):
    data: list[AuditEntry]
