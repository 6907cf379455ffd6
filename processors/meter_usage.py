"""RunCompleted | RunRejected -> ClickHouse usage rows, in batches, one row per run (ReplacingMergeTree by run)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from processors.stage import Stage
from storage.clickhouse import UsageStore
from topics.codec import Event
from topics.pipeline import RUN_COMPLETED, RUN_REJECTED


def _ms(value: datetime | int) -> int:
    return int(value.timestamp() * 1000) if isinstance(value, datetime) else value


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _row(prompt: Event, **fields: Any) -> dict[str, Any]:
    return {
        "run_id": prompt["run_id"],
        "user_id": prompt["user_id"],
        "tier": prompt["tier"],
        "chat_id": prompt["chat_id"],
        **fields,
    }


def completed_row(done: Event) -> dict[str, Any]:
    usage = done["usage"]
    return _row(
        done["prompt"],
        event_id=done["event_id"],
        model=done["model"],
        pool=done["pool"],
        prompt_tokens=usage["prompt_tokens"],
        completion_tokens=usage["completion_tokens"],
        cached_tokens=usage["cached_tokens"],
        ttft_ms=done["ttft_ms"],
        duration_ms=done["duration_ms"],
        finish_reason=done["finish_reason"],
        created_at=_iso(_ms(done["completed_at"])),
    )


def rejected_row(rejected: Event) -> dict[str, Any]:
    prompt = rejected["prompt"]
    return _row(
        prompt,
        event_id=rejected["event_id"],
        model=prompt["model"] or "",
        pool="",
        prompt_tokens=0,
        completion_tokens=0,
        cached_tokens=0,
        ttft_ms=0.0,
        duration_ms=0.0,
        finish_reason=f"rejected:{rejected['code']}",
        created_at=_iso(_ms(rejected["rejected_at"])),
    )


def register(stage: Stage, store: UsageStore) -> None:
    settings = stage.settings

    async def write(rows: list[dict[str, Any]]) -> None:
        await asyncio.get_running_loop().run_in_executor(None, store.write, rows)

    async def on_completed(batch: list[Event]) -> None:
        await write([completed_row(e) for e in batch])

    async def on_rejected(batch: list[Event]) -> None:
        await write([rejected_row(e) for e in batch])

    stage.consume_batches(RUN_COMPLETED, on_completed, settings.meter_batch, settings.meter_batch_s)
    stage.consume_batches(RUN_REJECTED, on_rejected, settings.meter_batch, settings.meter_batch_s)

    # The embedded engine is owned by this process, so the others read usage through these views.
    @stage.app.page("/usage/{user_id}")
    async def totals(web: Any, request: Any, user_id: str) -> Any:
        result = await asyncio.get_running_loop().run_in_executor(None, store.totals, user_id)
        return web.json(result)

    @stage.app.page("/usage-rows/{run_id}")
    async def rows(web: Any, request: Any, run_id: str) -> Any:
        from storage.clickhouse import quote

        found = await asyncio.get_running_loop().run_in_executor(None, store.rows, f"run_id = {quote(run_id)}")
        return web.json({"data": found})
