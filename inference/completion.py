"""How a run ended, as its RunCompleted says: usage (a continued run counted once), timing, moderation (pure)."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field

from inference.engine import Outcome
from inference.takeover import Prior
from topics.clock import now_ms
from topics.events import RunCompleted, RunScheduled, Usage
from topics.records import cited_sources, recalled_memories


@dataclass
class Timing:
    """What a run's usage row reports besides tokens: the gaps between its tokens, its wait before serving,
    and what the output guard did."""

    queue_ms: float = 0.0
    gaps_ms: list[float] = field(default_factory=list)
    moderation: str = "passed"

    def itl(self, q: float) -> float:
        """The q-quantile of the gaps between consecutive tokens (nearest rank; 0 with none) (pure)."""
        if not self.gaps_ms:
            return 0.0
        ranked = sorted(self.gaps_ms)
        return round(ranked[min(len(ranked) - 1, max(0, math.ceil(q * len(ranked)) - 1))], 3)


def completed(
    run: RunScheduled,
    text: str,
    finish_reason: str,
    usage: Usage,
    ttft_ms: float,
    duration_ms: float,
    served_by: str,
    error: str | None = None,
    timing: Timing | None = None,
) -> RunCompleted:
    timing = timing or Timing()
    return {
        # One id per run: a RunCompleted published again after a takeover is the same event to every sink.
        "event_id": str(
            uuid.uuid5(uuid.NAMESPACE_URL, f"parley:run-completed:{run['prompt']['run_id']}")
        ),
        "prompt": run["prompt"],
        "pool": run["pool"],
        "model": run["model"],
        "content": text,
        "finish_reason": finish_reason,
        "usage": usage,
        "ttft_ms": ttft_ms,
        "duration_ms": duration_ms,
        "error_message": error,
        "served_by": served_by,
        "itl_p50_ms": timing.itl(0.5),
        "itl_p99_ms": timing.itl(0.99),
        "queue_ms": timing.queue_ms,
        "moderation": timing.moderation,
        "memories": recalled_memories(run),
        "sources": cited_sources(run),
        "tools": [],
        "completed_at": now_ms(),
    }


def usage_after(prior: Prior, outcome: Outcome | None) -> Usage:
    """The run's usage (pure). A continued run's engine prompt held the text published before; that text is
    counted once, as completion, and the prompt as the user's own (the re-read is our failure's cost)."""
    if outcome is None:
        return {"prompt_tokens": 0, "completion_tokens": prior.tokens, "cached_tokens": 0}
    prompt = (
        max(0, outcome.prompt_tokens - prior.tokens) if prior.started else outcome.prompt_tokens
    )
    return {
        "prompt_tokens": prompt,
        "completion_tokens": prior.tokens + outcome.completion_tokens,
        "cached_tokens": min(outcome.cached_tokens, prompt),
    }
