"""A question the log may have taken although the edge refused it: the fence that decides, once, which.

The edge opens a run in the store, then publishes its prompt. When the log does not acknowledge the prompt
within the producer's delivery timeout, the outcome is unknown: a broker killed after it appended the record
but before it answered brings the record back when it restarts. The edge must not answer 503 (a promise that
nothing is kept) while the scheduler serves that prompt, so the two settle the run's fate by compare-and-set
(`run_fates`, first writer wins):
- the edge, on a publish that failed, writes `withdrawn`; when it finds `taken` instead, the prompt is in the
  log after all and the edge streams its replies from there;
- the scheduler, before it acts on a prompt the edge may have given up on, writes `taken`; when it finds
  `withdrawn`, it drops the prompt (a RunRejected `withdrawn`, which persistence reads as "keep nothing").

A prompt is suspect when it reaches a stage `SUSPECT_AFTER_MS` or more after it was published. A fresher one
cannot be one the edge gives up on: the log that delivers it to a stage within seconds acknowledges it to the
edge as fast (the producer retries the same record within `reconnect.backoff.max.ms`, runtime/kafka.py, and
the broker recognises it). So a fresh prompt costs nothing, and a late one (after an outage or a long
backlog) one compare-and-set.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from runtime.kafka import DELIVERY_TIMEOUT_MS

WITHDRAWN, TAKEN = "withdrawn", "taken"
SUSPECT_AFTER_MS = DELIVERY_TIMEOUT_MS // 2
# the most the edge spends settling a run's fate (past it, the store is down too)
WITHDRAW_TIMEOUT_S = 10.0


def suspect(prompt: Mapping[str, Any], now_ms: int) -> bool:
    """Whether the edge may have given up on this prompt: a chat run (the stateless OpenAI route opens no run
    to withdraw) published at least SUSPECT_AFTER_MS ago (pure)."""
    if not prompt.get("store", True) or prompt.get("messages"):
        return False
    return bool(now_ms - prompt["created_at"] >= SUSPECT_AFTER_MS)


def ids(prompt: Mapping[str, Any]) -> tuple[uuid.UUID, uuid.UUID]:
    return uuid.UUID(prompt["chat_id"]), uuid.UUID(prompt["run_id"])
