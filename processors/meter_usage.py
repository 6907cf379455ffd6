"""RunCompleted | RunRejected -> ClickHouse usage rows, in batches, exactly one row per run; and the audit
record (AuditEvent) -> ClickHouse audit_log. The same runs, and MemoryChanged, keep a person's chats searchable
(processors/search_index.py).

A batch is written, then its offsets are committed (faust commits acked events); a crash between the two
delivers the batch again, and `UsageStore.write` skips the runs already stored, so neither the rows nor the
rollups change. The same row functions rebuild usage from the topics for reconciliation (processors/reconcile.py).
The embedded engine is owned by this process, so the edge and the CLI read usage through its web views.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Histogram

from processors import embeddings, search_index, usage_pages
from processors.search_index import Index
from processors.settings import ProcessorSettings
from processors.stage import Handler, Stage, on_batches
from processors.usage_pages import in_thread
from safety.encoder import Encoder
from storage import audit, usage_erasure
from storage.clickhouse import iso
from storage.usage import UsageStore, open_usage
from topics.events import AuditEvent, MemoryChanged, PromptAccepted, RunCompleted, RunRejected
from topics.pipeline import AUDIT, MEMORY_CHANGED, RUN_COMPLETED, RUN_REJECTED, Topic

log = logging.getLogger(__name__)

ROWS = Counter("parley_metering_rows_total", "Usage rows", ["outcome"])  # written | already stored
AUDITED = Counter("parley_audit_events_total", "Audit events kept in ClickHouse")
UNPRICED = Counter(
    "parley_metering_unpriced_runs_total", "Runs of a model missing from the price table", ["model"]
)
LAG = Histogram(
    "parley_metering_lag_seconds",
    "From a run's end (RunCompleted/RunRejected) to its usage row written",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
PER_MILLION = Decimal(1_000_000)
DEFAULT_PRICES = Path(__file__).with_name("prices.toml")


class Prices:
    """USD per million tokens per model, from a TOML table (processors/prices.toml)."""

    def __init__(self, table: dict[str, dict[str, float]]) -> None:
        self.table = {
            model: {k: Decimal(str(v)) for k, v in p.items()} for model, p in table.items()
        }

    @classmethod
    def load(cls, path: str = "") -> Prices:
        with open(path or DEFAULT_PRICES, "rb") as f:
            return cls(tomllib.load(f).get("models", {}))

    def cost(self, model: str, prompt: int, cached: int, completion: int) -> Decimal:
        price = self.table.get(model)
        if price is None:
            if model:
                UNPRICED.labels(model).inc()
            return Decimal(0)
        cents = (
            (prompt - cached) * price.get("prompt", Decimal(0))
            + cached * price.get("cached", Decimal(0))
            + completion * price.get("completion", Decimal(0))
        )
        return (cents / PER_MILLION).quantize(Decimal("0.000000001"))


def kind(prompt: PromptAccepted) -> str:
    if prompt.get("summary"):
        return "summary"
    return (
        "completion" if prompt.get("messages") else "chat"
    )  # the OpenAI route carries its whole conversation


def _row(prompt: PromptAccepted, event_id: str, ended_ms: int, **fields: Any) -> dict[str, Any]:
    """The fields every usage row takes from the run's prompt, then the rest."""
    return {
        "run_id": prompt["run_id"],
        "event_id": event_id,
        "user_id": prompt["user_id"],
        "tier": prompt["tier"],
        "chat_id": prompt["chat_id"],
        "kind": kind(prompt),
        **fields,
        "created_at": iso(ended_ms),
    }


def completed_row(done: RunCompleted, prices: Prices) -> dict[str, Any]:
    prompt, usage = done["prompt"], done["usage"]
    return _row(
        prompt,
        done["event_id"],
        done["completed_at"],
        model=done["model"],
        pool=done["pool"],
        prompt_tokens=usage["prompt_tokens"],
        completion_tokens=usage["completion_tokens"],
        cached_tokens=usage["cached_tokens"],
        ttft_ms=done["ttft_ms"],
        itl_p50_ms=done.get("itl_p50_ms", 0.0),
        itl_p99_ms=done.get("itl_p99_ms", 0.0),
        queue_ms=done.get("queue_ms", 0.0),
        duration_ms=done["duration_ms"],
        finish_reason=done["finish_reason"],
        moderation=done.get("moderation", "passed"),
        cost_usd=str(
            prices.cost(
                done["model"],
                usage["prompt_tokens"],
                usage["cached_tokens"],
                usage["completion_tokens"],
            )
        ),
    )


NOTHING_SERVED = {
    "pool": "",
    "prompt_tokens": 0,
    "completion_tokens": 0,
    "cached_tokens": 0,
    "ttft_ms": 0.0,
    "itl_p50_ms": 0.0,
    "itl_p99_ms": 0.0,
    "queue_ms": 0.0,
    "duration_ms": 0.0,
    "cost_usd": "0",
}


def rejected_row(rejected: RunRejected) -> dict[str, Any]:
    prompt = rejected["prompt"]
    refused = rejected["code"] == "content_filter"
    return _row(
        prompt,
        rejected["event_id"],
        rejected["rejected_at"],
        **NOTHING_SERVED,
        model=prompt["model"] or "",
        finish_reason=f"rejected:{rejected['code']}",
        moderation=f"refused:{rejected['category'] or 'policy'}" if refused else "passed",
    )


def usage_row(topic: Topic[Any], event: Any, prices: Prices) -> tuple[dict[str, Any], int]:
    """A RunCompleted's or RunRejected's usage row, and when its run ended (epoch ms); `topic` says which."""
    if topic is RUN_COMPLETED:
        done: RunCompleted = event
        return completed_row(done, prices), done["completed_at"]
    rejected: RunRejected = event
    return rejected_row(rejected), rejected["rejected_at"]


@dataclass(frozen=True)
class Deps:
    store: UsageStore
    prices: Prices
    crash_point: Callable[
        [str], None
    ]  # tests: a process killed between the write and the offsets' commit
    index: Index


def write(rows: list[dict[str, Any]], ended_ms: list[int], deps: Deps) -> None:
    written = deps.store.write(rows)
    ROWS.labels("written").inc(written)
    ROWS.labels("already stored").inc(len(rows) - written)
    now = datetime.now(UTC).timestamp()
    for ms in ended_ms:
        LAG.observe(max(0.0, now - ms / 1000))
    if written < len(rows):
        log.info(
            "usage: %d of %d rows were already stored (redelivered or replayed)",
            len(rows) - written,
            len(rows),
        )
    deps.crash_point("metering-after-write")


async def on_completed(batch: list[RunCompleted], deps: Deps) -> None:
    rows = [completed_row(done, deps.prices) for done in batch]
    await in_thread(write, rows, [done["completed_at"] for done in batch], deps)
    await search_index.on_completed(batch, deps.index)


async def on_rejected(batch: list[RunRejected], deps: Deps) -> None:
    rows = [rejected_row(rejected) for rejected in batch]
    await in_thread(write, rows, [rejected["rejected_at"] for rejected in batch], deps)
    await search_index.on_rejected(batch, deps.index)


async def on_audit(batch: list[AuditEvent], deps: Deps) -> None:
    """The audit record, kept (a redelivered event replaces its own row)."""
    await in_thread(audit.write, deps.store.backend, deps.store.db, list(batch))
    AUDITED.inc(len(batch))


async def on_changed(batch: list[MemoryChanged], deps: Deps) -> None:
    await search_index.on_changed(batch, deps.index)
    for event in batch:
        if (
            event["action"] == "person_erased"
        ):  # usage rows kept under a pseudonym, as billing records
            store = deps.store
            pseudonym, moved = await in_thread(
                usage_erasure.pseudonymise, store.backend, store.db, event["user_id"]
            )
            log.info(
                "person %s erased: %d usage rows now under %s", event["user_id"], moved, pseudonym
            )


HANDLERS: list[Handler[Deps]] = [
    on_batches(RUN_COMPLETED, on_completed),
    on_batches(RUN_REJECTED, on_rejected),
    on_batches(AUDIT, on_audit),
    on_batches(MEMORY_CHANGED, on_changed),
]


def build(stage: Stage, settings: ProcessorSettings) -> None:
    store = open_usage(settings)
    encoder = Encoder()
    index = Index(store.backend, store.db, encoder)
    prices = Prices.load(settings.price_table)
    deps = Deps(store, prices, stage.crash_point, index)
    stage.serve(HANDLERS, deps, batch=(settings.meter_batch, settings.meter_batch_s))
    usage_pages.add(stage, store)
    search_index.add(stage, index)
    embeddings.add(stage, encoder, store, prices.cost)
