"""What every route depends on: the process's services (built once by the app's lifespan, api/app.py), each
given to a route through its own `Annotated` alias, so a route takes only what it uses and a test overrides one
(`app.dependency_overrides[conversations] = ...`). `Deps` is the whole set, for opening a run (api/runs.py),
which uses most of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import httpx
from fastapi import Depends, Request

from admission.limits import LimitsView
from admission.placement import PoolView
from api.memories import MemoryGuard
from api.oidc import Provider
from api.replies import ReplyHub
from api.settings import ApiSettings
from runtime.kafka import AsyncProducer
from runtime.keys import Keyring
from runtime.mcp import ToolServersView
from safety.policy import PolicyView
from storage.api_keys import ApiKeys
from storage.conversations import Conversations
from storage.decisions import SafetyDecisions
from storage.documents import Documents
from storage.idempotency import IdempotencyKeys
from storage.ledger import Ledger
from storage.memories import Memories
from storage.people import People
from storage.preferences import Preferences
from storage.responses import Responses
from storage.retention import Retention
from storage.shares import Shares


@dataclass
class Services:
    settings: ApiSettings
    producer: AsyncProducer
    replies: ReplyHub
    conversations: Conversations
    http: httpx.AsyncClient
    ledger: Ledger
    limits: LimitsView
    pools: PoolView  # the inference consumers' load: the edge sheds at the door what could not be placed
    policies: PolicyView  # the safety policies, for the admin routes
    keys: ApiKeys
    # the moderation decisions admins review (written by the persistence stage)
    decisions: SafetyDecisions
    idempotency: IdempotencyKeys
    people: People  # the directory, browser sessions and sign-ins under way
    preferences: Preferences  # a person's instructions, a chat's instructions and model
    shares: Shares  # shared snapshots of chats
    memories: Memories  # what people asked Parley to remember across their chats
    memory_guard: MemoryGuard  # checks a memory before it is kept (api/memories.py)
    retention: Retention  # what the sweep of chats past their age reads (api/retention.py)
    responses: Responses  # the Responses API's stored requests (answers: their runs' records)
    documents: Documents  # files attached to chats (storage/documents.py)
    tool_servers: ToolServersView  # the MCP servers admins registered (runtime/mcp.py)
    provider: Provider | None  # the OpenID Connect provider, when one is configured
    sealing: Keyring | None  # people's data keys (runtime/keys.py); None: sealing is off


def services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


Deps = Annotated[Services, Depends(services)]


def settings(request: Request) -> ApiSettings:
    return request.app.state.settings  # type: ignore[no-any-return]


def producer(deps: Deps) -> AsyncProducer:
    return deps.producer


def replies(deps: Deps) -> ReplyHub:
    return deps.replies


def conversations(deps: Deps) -> Conversations:
    return deps.conversations


def http(deps: Deps) -> httpx.AsyncClient:
    return deps.http


def ledger(deps: Deps) -> Ledger:
    return deps.ledger


def limits(deps: Deps) -> LimitsView:
    return deps.limits


def policies(deps: Deps) -> PolicyView:
    return deps.policies


def keys(deps: Deps) -> ApiKeys:
    return deps.keys


def decisions(deps: Deps) -> SafetyDecisions:
    return deps.decisions


def idempotency(deps: Deps) -> IdempotencyKeys:
    return deps.idempotency


def people(deps: Deps) -> People:
    return deps.people


def preferences(deps: Deps) -> Preferences:
    return deps.preferences


def shares(deps: Deps) -> Shares:
    return deps.shares


def memories(deps: Deps) -> Memories:
    return deps.memories


def memory_guard(deps: Deps) -> MemoryGuard:
    return deps.memory_guard


def provider(deps: Deps) -> Provider | None:
    return deps.provider


SettingsDep = Annotated[ApiSettings, Depends(settings)]
ProducerDep = Annotated[AsyncProducer, Depends(producer)]
RepliesDep = Annotated[ReplyHub, Depends(replies)]
ConversationsDep = Annotated[Conversations, Depends(conversations)]
HttpDep = Annotated[httpx.AsyncClient, Depends(http)]
LedgerDep = Annotated[Ledger, Depends(ledger)]
LimitsDep = Annotated[LimitsView, Depends(limits)]
PoliciesDep = Annotated[PolicyView, Depends(policies)]
KeysDep = Annotated[ApiKeys, Depends(keys)]
DecisionsDep = Annotated[SafetyDecisions, Depends(decisions)]
IdempotencyDep = Annotated[IdempotencyKeys, Depends(idempotency)]
PeopleDep = Annotated[People, Depends(people)]
PreferencesDep = Annotated[Preferences, Depends(preferences)]
SharesDep = Annotated[Shares, Depends(shares)]


def documents(deps: Deps) -> Documents:
    return deps.documents


DocumentsDep = Annotated[Documents, Depends(documents)]
MemoriesDep = Annotated[Memories, Depends(memories)]
MemoryGuardDep = Annotated[MemoryGuard, Depends(memory_guard)]
ProviderDep = Annotated[Provider | None, Depends(provider)]
