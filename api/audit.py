"""The audit record: every admin action and every read of another person's data is an event on the audit topic
(who, what, whose, when, from where), written before the route answers, so nothing is read or changed without
its trace: if the log cannot take the event, the route answers 503 and shows nothing. The metering stage keeps
the events in ClickHouse (`audit_log`), which the owner and auditors read (GET /v1/admin/audit)."""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request

from api.auth import CurrentUser, Principal
from api.deps import ProducerDep
from runtime.kafka import AsyncProducer
from topics.events import AuditEvent
from topics.pipeline import AUDIT

log = logging.getLogger(__name__)


async def record(
    producer: AsyncProducer,
    request: Request,
    actor: Principal,
    action: str,
    resource: str,
    target_user: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    event: AuditEvent = {
        "event_id": str(uuid.uuid4()),
        "at": int(time.time() * 1000),
        "actor": actor.user_id,
        "actor_role": actor.role,
        "action": action,
        "target_user": target_user,
        "resource": resource,
        "from_addr": request.client.host if request.client else "",
        "detail": json.dumps(detail, sort_keys=True, default=str) if detail else "",
    }
    await producer.publish(AUDIT, event, key=actor.user_id)
    log.info("audit: %s %s %s (of %s)", actor.user_id, action, resource, target_user or "-")


@dataclass(frozen=True)
class Trail:
    """The audit record, bound to a request and who makes it: `await trail(action, resource, target, detail)`."""

    producer: AsyncProducer
    request: Request
    actor: Principal

    async def __call__(
        self,
        action: str,
        resource: str,
        target_user: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        await record(self.producer, self.request, self.actor, action, resource, target_user, detail)


def trail(request: Request, producer: ProducerDep, user: CurrentUser) -> Trail:
    return Trail(producer, request, user)


TrailDep = Annotated[Trail, Depends(trail)]
