"""What every route depends on: the process's services (built once by the app's lifespan, api/app.py), given to
a route through FastAPI's dependency injection (`deps: Deps`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import httpx
from fastapi import Depends, Request

from admission.limits import LimitsView
from admission.placement import PoolView
from api.replies import ReplyHub
from api.settings import ApiSettings
from runtime.kafka import AsyncProducer
from safety.policy import PolicyView
from storage.api_keys import ApiKeys
from storage.conversations import Conversations
from storage.decisions import SafetyDecisions
from storage.ledger import Ledger


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


def services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


Deps = Annotated[Services, Depends(services)]
