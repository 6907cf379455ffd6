"""RunCompleted | RunRejected -> ClickHouse usage rows, in batches, exactly one row per run.

A batch is written, then its offsets are committed (faust commits acked events); a crash between the two
delivers the batch again, and `UsageStore.write` skips the runs already stored, so neither the rows nor the
rollups change. The same row functions rebuild usage from the topics for reconciliation (processors/reconcile.py).
The embedded engine is owned by this process, so the edge and the CLI read usage through its web views.
"""

from __future__ import annotations

import asyncio
import logging
import tomllib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from faust.web import View
from prometheus_client import Counter, Histogram

from processors.stage import Stage
from storage.clickhouse import iso
from storage.usage import UsageStore
from topics.codec import Event
from topics.pipeline import RUN_COMPLETED, RUN_REJECTED, Topic

log = logging.getLogger(__name__)

ROWS = Counter("parley_metering_rows_total", "Usage rows", ["outcome"])  # written | already stored
UNPRICED = Counter("parley_metering_unpriced_runs_total", "Runs of a model missing from the price table", ["model"])
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
        self.table = {model: {k: Decimal(str(v)) for k, v in p.items()} for model, p in table.items()}

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


def kind(prompt: Event) -> str:
    if prompt.get("summary"):
        return "summary"
    return "completion" if prompt.get("messages") else "chat"  # the OpenAI route carries its whole conversation


def _row(prompt: Event, event_id: str, ended_ms: int, **fields: Any) -> dict[str, Any]:
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


def completed_row(done: Event, prices: Prices) -> dict[str, Any]:
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
            prices.cost(done["model"], usage["prompt_tokens"], usage["cached_tokens"], usage["completion_tokens"])
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


def rejected_row(rejected: Event) -> dict[str, Any]:
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


def usage_row(topic: Topic[Any], event: Event, prices: Prices) -> tuple[dict[str, Any], int]:
    """A RunCompleted's or RunRejected's usage row, and when its run ended (epoch ms)."""
    if topic is RUN_COMPLETED:
        return completed_row(event, prices), event["completed_at"]
    return rejected_row(event), event["rejected_at"]


def register(stage: Stage, store: UsageStore) -> None:
    settings = stage.settings
    prices = Prices.load(settings.price_table)

    def write(rows: list[dict[str, Any]], ended_ms: list[int]) -> None:
        written = store.write(rows)
        ROWS.labels("written").inc(written)
        ROWS.labels("already stored").inc(len(rows) - written)
        now = datetime.now(UTC).timestamp()
        for ms in ended_ms:
            LAG.observe(max(0.0, now - ms / 1000))
        if written < len(rows):
            log.info(
                "usage: %d of %d rows were already stored (redelivered or replayed)", len(rows) - written, len(rows)
            )
        stage.crash_point("metering-after-write")

    async def run(fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    def metered(topic: Topic[Any]) -> Callable[[list[Any]], Awaitable[None]]:
        async def on_batch(batch: list[Event]) -> None:
            rows, ended = zip(*(usage_row(topic, e, prices) for e in batch), strict=True)
            await run(write, list(rows), list(ended))

        return on_batch

    for topic in (RUN_COMPLETED, RUN_REJECTED):
        stage.consume_batches(topic, metered(topic), settings.meter_batch, settings.meter_batch_s)

    @stage.app.page("/usage/{user_id}")
    async def totals(web: Any, request: Any, user_id: str) -> Any:
        stage.require_internal(request)
        return web.json(await run(store.totals, user_id))

    @stage.app.page("/usage-rows/{run_id}")
    async def rows(web: Any, request: Any, run_id: str) -> Any:
        stage.require_internal(request)
        from storage.clickhouse import quote

        return web.json({"data": await run(store.rows, f"run_id = {quote(run_id)}")})

    @stage.app.page("/usage-range")
    async def between(web: Any, request: Any) -> Any:
        """?since=&until= (epoch ms): the stored rows in the range, for reconciliation."""
        stage.require_internal(request)
        since, until = int(request.query["since"]), int(request.query["until"])
        return web.json({"data": await run(store.between, since, until)})

    @stage.app.page("/usage-rollup-check")
    async def rollup_check(web: Any, request: Any) -> Any:
        """?since=&until= (epoch ms): rollup buckets whose sums differ from the rows'."""
        stage.require_internal(request)
        since, until = int(request.query["since"]), int(request.query["until"])
        return web.json({"data": await run(store.rollup_drift, since, until)})

    @stage.app.page("/usage-report")
    async def report(web: Any, request: Any) -> Any:
        """?since=&until= (epoch ms)[&user_id=][&source=rollup|usage]: what the dashboard draws."""
        stage.require_internal(request)
        q = request.query
        args = (int(q["since"]), int(q["until"]), q.get("user_id") or None, q.get("source", "rollup"))
        return web.json(await run(store.report, *args))

    @stage.app.page("/eval-results")
    class Evals(View):
        async def get(self, request: Any) -> Any:
            """?label=: one label's eval case results; no label: every label's totals."""
            stage.require_internal(request)
            label = request.query.get("label")
            found = await run(store.evals, label) if label else await run(store.eval_labels)
            return self.json({"data": found})

        async def post(self, request: Any) -> Any:
            """{"rows": [...]}: eval case results (`parley eval run`)."""
            stage.require_internal(request)
            body = await request.json()
            written = await run(store.write_evals, body["rows"])
            log.info(
                "evals: %d case results stored for label %s", written, body["rows"][0]["label"] if written else "-"
            )
            return self.json({"written": written})

    @stage.app.page("/usage-rollup-rebuild")
    class Rebuild(View):
        async def post(self, request: Any) -> Any:
            """{"since", "until"} (epoch ms): recompute the rollup buckets of the range from the rows."""
            stage.require_internal(request)
            body = await request.json()
            await run(store.rebuild_rollups, int(body["since"]), int(body["until"]))
            log.info("usage repair: rollups rebuilt for %s..%s", body["since"], body["until"])
            return self.json({"rebuilt": True})

    @stage.app.page("/usage-repair")
    class Repair(View):
        async def post(self, request: Any) -> Any:
            """{"rows": [...]}: rows rebuilt from the log for runs missing here (reconciliation --repair)."""
            stage.require_internal(request)
            body = await request.json()
            written = await run(store.write, body["rows"])
            log.info("usage repair: %d rows written of %d sent", written, len(body["rows"]))
            return self.json({"written": written})
